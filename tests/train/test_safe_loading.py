"""Nothing rlfleet reads is unpickled: crafted files are refused, their payload never runs."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from rlfleet.checkpoint import load_checkpoint, save_checkpoint
from rlfleet.errors import CheckpointError

PACKAGE = Path(__file__).resolve().parents[2] / "rlfleet"


class Payload:
    """Unpickling this writes a marker file: proof that code ran."""

    marker = ""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (Path.touch, (self.marker,))  # type: ignore[return-value]


def _rewrite_manifest(directory: Path) -> None:
    """Recompute checksums, as an attacker who edits files would."""
    manifest = json.loads((directory / "manifest.json").read_text())
    for name, entry in manifest["files"].items():
        data = (directory / name).read_bytes()
        entry["sha256"] = hashlib.sha256(data).hexdigest()
        entry["bytes"] = len(data)
    (directory / "manifest.json").write_text(json.dumps(manifest))


def test_pickle_payload_in_a_checkpoint_never_runs(tmp_path: Path) -> None:
    ckpt = save_checkpoint(tmp_path / "ckpt", {"w": torch.ones(3)}, {"algorithm": "ppo"})
    marker = tmp_path / "payload-ran"
    payload = Payload()
    payload.marker = str(marker)
    torch.save(
        {"w": payload}, ckpt / "tensors.safetensors"
    )  # a pickle, under the tensor file's name
    _rewrite_manifest(ckpt)
    with pytest.raises(CheckpointError):
        load_checkpoint(ckpt)
    assert not marker.exists()


def test_json_state_cannot_smuggle_objects(tmp_path: Path) -> None:
    ckpt = save_checkpoint(tmp_path / "ckpt", {"w": torch.ones(3)}, {"algorithm": "ppo"})
    (ckpt / "state.json").write_text(json.dumps({"$object": "os.system", "args": ["true"]}))
    _rewrite_manifest(ckpt)
    with pytest.raises(CheckpointError):
        load_checkpoint(ckpt)


def test_numpy_object_arrays_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "data.npz"
    np.savez(path, obs=np.array([Payload()], dtype=object))
    with pytest.raises(ValueError, match="allow_pickle"):
        np.load(path, allow_pickle=False)["obs"]


def test_the_package_never_unpickles() -> None:
    forbidden = re.compile(
        r"pickle\.loads?\(|cloudpickle|allow_pickle=True|weights_only=False|(?<![\w.])torch\.load\((?![^)]*weights_only=True)"
    )
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}"
        for path in PACKAGE.rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if forbidden.search(line)
    ]
    assert not offenders, offenders


def test_a_checkpoint_written_in_format_1_still_loads() -> None:
    """tests/data/checkpoint-format1 was written by format 1 and is never regenerated: when the
    format changes, this proves older checkpoints still load."""
    state, metadata = load_checkpoint(
        Path(__file__).resolve().parents[1] / "data" / "checkpoint-format1"
    )
    assert metadata["algorithm"] == "example"
    assert torch.equal(state["weights"]["layer.weight"], torch.arange(6.0).reshape(2, 3))
    assert state["optimizer"]["state"][0]["step"].item() == 3.0
    assert state["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)
    assert state["rng"] == np.random.default_rng(7).bit_generator.state
    assert state["counters"] == {"env_step": 4096, "best_score": float("-inf")}
    assert state["buffer"].dtype == np.uint8
