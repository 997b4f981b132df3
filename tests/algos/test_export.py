"""ONNX export: every algorithm's graph, run by onnxruntime, takes the actions its torch
``predict`` takes, on observations recorded from its env."""

from __future__ import annotations

import dataclasses
import errno
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from gymnasium import spaces

from rlfleet.algos import PPO, SAC, PPOConfig, get_algorithm, list_algorithms
from rlfleet.algos.base import Algorithm
from rlfleet.algos.export import OPSET, export_onnx, observation_layout
from rlfleet.algos.registry import algorithms_supporting_masks
from rlfleet.config.loader import validate
from rlfleet.envs.make import make_vec_env
from rlfleet.errors import ConfigError, RunDirError
from rlfleet.nn.encoders import float32_from_bytes
from rlfleet.nn.masks import MASK_KEY
from tests.algos.test_shared import SHORT_RUN, _algorithm_for_short_run

RECORDED = 1000
"""Observations recorded per algorithm."""


def _record(algo: Algorithm[Any], env_id: str) -> np.ndarray:
    """``RECORDED`` observations from 8 envs stepped with the policy's sampled actions."""
    envs = make_vec_env(env_id, 8, seed=3)
    try:
        obs, _ = envs.reset(seed=3)
        recorded = []
        while len(recorded) * 8 < RECORDED:
            recorded.append(obs)
            obs, *_ = envs.step(algo.predict(obs, deterministic=False))
    finally:
        envs.close()
    return np.concatenate(recorded)[:RECORDED]


def _run(path: Path, feed: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    actions: np.ndarray = session.run(["actions"], feed)[0]
    return actions


def _metadata(path: Path) -> dict[str, str]:
    """The model's metadata_props as a dict."""
    return {p.key: p.value for p in onnx.load(str(path)).metadata_props}


TIES_ALLOWED = 1
"""Discrete actions that may differ in a batch of ``RECORDED``: two runtimes sum in other
orders, so where two actions' scores tie to the last bits of a float32 their argmax can
differ (seen once in several thousand runs of this test). A wrong graph changes many."""


def _assert_same_actions(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.shape == expected.shape
    assert got.dtype == expected.dtype
    if np.issubdtype(expected.dtype, np.floating):
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)
    else:
        differ = (got != expected).reshape(len(got), -1).any(axis=1)
        assert differ.sum() <= TIES_ALLOWED, (
            f"{differ.sum()} of {len(got)} actions differ: rows {np.flatnonzero(differ)[:10]}"
        )


@pytest.mark.parametrize("name", list_algorithms())
def test_onnx_policy_takes_the_torch_policys_actions(name: str, tmp_path: Path) -> None:
    env_id = SHORT_RUN[name][0]
    # Weights moved far enough from their init for the greedy action to vary over the
    # recorded observations: the policies must not agree by always taking one action. The
    # first of a few fixed perturbations that gives such a policy is used.
    for seed in range(10):
        algo = _algorithm_for_short_run(name)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for module in algo.modules().values():
                for parameter in module.parameters():
                    noise = torch.randn(parameter.shape, generator=generator) * 0.05
                    parameter.add_(noise.to(parameter.dtype))
        obs = _record(algo, env_id)
        expected = algo.predict(obs)
        if len(np.unique(expected, axis=0)) > 1:
            break
    else:
        pytest.fail(f"{name}: no perturbation gave a policy that takes more than one action")
    path = algo.export_onnx(tmp_path / f"{name}.onnx")
    got = _run(path, {"obs": algo.obs_layout.to_tensor(obs).numpy()})
    _assert_same_actions(got, expected)


ACTION_SPACES: dict[str, spaces.Space[Any]] = {
    "discrete": spaces.Discrete(4, start=-1),
    "box": spaces.Box(-2.0, 2.0, (2,), np.float32),
    "multi-discrete": spaces.MultiDiscrete([3, 4], start=[1, 0]),
    "multi-binary": spaces.MultiBinary(3),
}


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        (name, kind)
        for name in list_algorithms()
        for kind, space in ACTION_SPACES.items()
        if isinstance(space, get_algorithm(name).action_spaces)
    ],
)
def test_every_action_space_an_algorithm_takes_exports_the_torch_policys_actions(
    name: str, kind: str, tmp_path: Path
) -> None:
    obs_space = spaces.Box(-1.0, 1.0, (5,), np.float32)
    algo = get_algorithm(name)(obs_space, ACTION_SPACES[kind], seed=2)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # weights away from their init, so that the actions vary
        for module in algo.modules().values():
            for parameter in module.parameters():
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.1)
    obs = np.random.default_rng(3).uniform(-1, 1, (RECORDED, 5)).astype(np.float32)
    expected = algo.predict(obs)
    assert len(np.unique(expected, axis=0)) > 1
    path = algo.export_onnx(tmp_path / f"{name}-{kind}.onnx")
    _assert_same_actions(_run(path, {"obs": obs}), expected)


NORMALIZING = [
    name
    for name in list_algorithms()
    if "normalize_obs" in {f.name for f in dataclasses.fields(get_algorithm(name).config_class)}
]
"""Every algorithm with an observation normaliser."""


@pytest.mark.parametrize("name", NORMALIZING)
def test_observation_normalisation_is_inside_the_graph(name: str, tmp_path: Path) -> None:
    space = spaces.Box(-100.0, 100.0, (3,), np.float32)
    cls = get_algorithm(name)
    actions: spaces.Space[Any] = (
        spaces.Discrete(3)
        if spaces.Discrete in cls.action_spaces
        else spaces.Box(-2.0, 2.0, (2,), np.float32)
    )
    algo = cls(space, actions, cls.config_class(normalize_obs=True), seed=1)
    rng = np.random.default_rng(0)
    obs = (rng.normal(size=(RECORDED, 3)) * [1.0, 30.0, 0.1] + [5.0, -40.0, 2.0]).astype(np.float32)
    if name in ("impala", "appo"):  # statistics that only their learner's update folds
        algo.obs_stats.normalizer.update(torch.from_numpy(obs))
    else:
        algo.preprocess(obs, update_stats=True)
    path = algo.export_onnx(tmp_path / f"{name}.onnx")
    expected = algo.predict(obs)
    _assert_same_actions(_run(path, {"obs": obs}), expected)
    assert len(np.unique(expected, axis=0)) > 1
    metadata = _metadata(path)
    assert metadata["rlfleet.obs_normalization"] == "in_graph"


def test_box_actions_are_scaled_and_clipped_to_the_bounds(tmp_path: Path) -> None:
    """PPO's Gaussian mean is unbounded: the graph clips it, SAC's squashed action is
    scaled to the bounds, both as ``predict`` does."""
    # Bounds narrow enough for PPO's freshly initialised means to fall outside them.
    low, high = np.array([-3e-3, 0.0], np.float32), np.array([3e-3, 5e-3], np.float32)
    action_space = spaces.Box(low, high)
    obs = np.random.default_rng(0).normal(scale=50.0, size=(RECORDED, 4)).astype(np.float32)
    for cls in (PPO, SAC):
        algo = cls(spaces.Box(-np.inf, np.inf, (4,), np.float32), action_space, seed=2)
        if cls is PPO:  # means far outside the bounds, so that the clip is exercised
            raw = algo.act(algo.preprocess(obs), deterministic=True).actions.numpy()
            assert np.any(raw < action_space.low)
            assert np.any(raw > action_space.high)
        path = algo.export_onnx(tmp_path / f"{algo.name}.onnx")
        got = _run(path, {"obs": obs})
        _assert_same_actions(got, algo.predict(obs))
        assert np.all(got >= action_space.low)
        assert np.all(got <= action_space.high)


_DICT_SPACE = spaces.Dict(
    {
        "position": spaces.Box(-1.0, 1.0, (2,), np.float32),
        "item": spaces.Discrete(3, start=1),
        "flags": spaces.MultiBinary(2),
        "nested": spaces.Dict({"level": spaces.MultiDiscrete([2, 3])}),
        MASK_KEY: spaces.MultiBinary(4),
    }
)


def _dict_batch(n: int) -> dict[str, Any]:
    """``n`` Dict observations, each mask with at least one legal action."""
    _DICT_SPACE.seed(0)
    samples = [_DICT_SPACE.sample() for _ in range(n)]

    def stack(parts: list[Any]) -> Any:
        if isinstance(parts[0], dict):
            return {key: stack([p[key] for p in parts]) for key in parts[0]}
        return np.stack(parts)

    batch: dict[str, Any] = stack(samples)
    mask = batch[MASK_KEY]
    mask[np.arange(n), np.random.default_rng(0).integers(4, size=n)] = 1
    return batch


def test_dict_observations_and_action_masks(tmp_path: Path) -> None:
    """A Dict observation with a mask key: the graph takes the packed row and the mask, and
    never picks a masked-out action."""
    algo = PPO(_DICT_SPACE, spaces.Discrete(4, start=2), seed=3)
    obs = _dict_batch(RECORDED)
    path = algo.export_onnx(tmp_path / "ppo.onnx")
    mask = obs[MASK_KEY].astype(bool)
    feed = {"obs": algo.obs_layout.to_tensor(obs).numpy(), "action_mask": mask}
    got = _run(path, feed)
    _assert_same_actions(got, algo.predict(obs))
    assert mask[np.arange(RECORDED), got - 2].all()

    metadata = _metadata(path)
    inputs = json.loads(metadata["rlfleet.inputs"])
    assert [i["name"] for i in inputs] == ["obs", "action_mask"]
    assert inputs[0]["shape"] == ["batch", algo.obs_layout.shape[0]]
    layout = json.loads(metadata["rlfleet.observation_layout"])
    assert layout == observation_layout(algo.obs_layout)
    # Parts in the Dict space's key order (gymnasium sorts a plain dict's keys).
    paths = [part["path"] for part in layout["parts"]]
    assert paths == [["flags"], ["item"], ["nested", "level"], ["position"]]
    assert layout["parts"][1] == {"path": ["item"], "offset": 2, "size": 3,
                                "encoding": "one_hot", "start": 1}  # fmt: skip
    assert sum(part["size"] for part in layout["parts"]) == layout["float_features"]


@pytest.mark.parametrize("name", algorithms_supporting_masks())
def test_every_masking_algorithm_exports_a_graph_that_never_picks_a_masked_action(
    name: str, tmp_path: Path
) -> None:
    # A vector observation, the mask input asked for (every masking algorithm takes these;
    # test_dict_observations_and_action_masks has the mask inside a Dict observation).
    algo = get_algorithm(name)(spaces.Box(-1.0, 1.0, (5,), np.float32), spaces.Discrete(4), seed=3)
    rng = np.random.default_rng(1)
    obs = rng.uniform(-1, 1, (RECORDED, 5)).astype(np.float32)
    mask = rng.random((RECORDED, 4)) < 0.5
    mask[np.arange(RECORDED), rng.integers(0, 4, RECORDED)] = True
    path = export_onnx(algo, tmp_path / f"{name}.onnx", action_mask=True)
    got = _run(path, {"obs": obs, "action_mask": mask})
    _assert_same_actions(got, algo.predict(obs, action_mask=mask))
    assert mask[np.arange(RECORDED), got].all()


@pytest.mark.parametrize("name", algorithms_supporting_masks())
def test_every_masking_algorithms_graph_gives_the_first_action_for_a_row_of_none(
    name: str, tmp_path: Path
) -> None:
    # docs/export.md: "a row of none ... the graph returns the first action for it".
    algo = get_algorithm(name)(
        spaces.Box(-1.0, 1.0, (5,), np.float32), spaces.Discrete(4, start=2), seed=3
    )
    obs = np.random.default_rng(2).uniform(-1, 1, (RECORDED, 5)).astype(np.float32)
    mask = np.zeros((RECORDED, 4), dtype=bool)
    path = export_onnx(algo, tmp_path / f"{name}.onnx", action_mask=True)
    assert _run(path, {"obs": obs, "action_mask": mask}).tolist() == [2] * RECORDED


def test_a_graph_without_the_mask_input_when_asked(tmp_path: Path) -> None:
    algo = get_algorithm("a2c")(_DICT_SPACE, spaces.Discrete(4), seed=4)
    path = export_onnx(algo, tmp_path / "a2c.onnx", action_mask=False)
    obs = _dict_batch(64)
    got = _run(path, {"obs": algo.obs_layout.to_tensor(obs).numpy()})
    ones = {**obs, MASK_KEY: np.ones_like(obs[MASK_KEY])}
    _assert_same_actions(got, algo.predict(ones))


IMAGE_TAKING = [
    name
    for name in list_algorithms()
    if "cnn" in {f.name for f in dataclasses.fields(get_algorithm(name).config_class)}
]
"""Every algorithm with a CNN encoder for image observations."""

_IMAGE = spaces.Box(0, 255, (10, 10, 4), np.uint8)
"""A MinAtar-sized image, height x width x channels."""


@pytest.mark.parametrize("name", IMAGE_TAKING)
def test_image_observations_export_as_uint8(name: str, tmp_path: Path) -> None:
    """An image observation is the graph's uint8 input as it is, and the graph takes the
    torch policy's actions on it."""
    config = validate(get_algorithm(name).config_class, {"cnn": "minatar"}, name)
    algo = get_algorithm(name)(_IMAGE, spaces.Discrete(4), config, seed=5)
    _IMAGE.seed(0)
    obs = np.stack([_IMAGE.sample() for _ in range(200)])
    expected = algo.predict(obs)
    assert len(np.unique(expected)) > 1
    path = algo.export_onnx(tmp_path / f"{name}.onnx")
    feed = algo.obs_layout.to_tensor(obs).numpy()
    assert feed.dtype == np.uint8
    assert feed.shape == obs.shape
    _assert_same_actions(_run(path, {"obs": obs}), expected)
    inputs = json.loads(_metadata(path)["rlfleet.inputs"])
    assert inputs[0] == {"name": "obs", "shape": ["batch", 10, 10, 4], "dtype": "uint8"}


def test_image_and_vector_parts_pack_into_one_uint8_row(tmp_path: Path) -> None:
    """A Dict of an image and a vector: one uint8 row, the float features bit-cast into its
    first bytes and the image's bytes after them, as the layout in the metadata says."""
    space = spaces.Dict({"frame": _IMAGE, "speed": spaces.Box(-1.0, 1.0, (3,), np.float32)})
    algo = PPO(space, spaces.Discrete(4), validate(PPOConfig, {"cnn": "minatar"}, "ppo"), seed=6)
    space.seed(1)
    samples = [space.sample() for _ in range(200)]
    obs = {key: np.stack([s[key] for s in samples]) for key in ("frame", "speed")}
    layout = json.loads(_metadata(path := algo.export_onnx(tmp_path / "ppo.onnx"))[
        "rlfleet.observation_layout"])  # fmt: skip
    speed, frame = (
        next(p for p in layout["parts"] if p["path"] == [k]) for k in ("speed", "frame")
    )
    assert speed == {"path": ["speed"], "offset": 0, "size": 3, "encoding": "values", "shape": [3]}
    assert frame == {"path": ["frame"], "offset": 12, "size": 400, "encoding": "image_bytes",
                     "shape": [10, 10, 4]}  # fmt: skip
    row = np.zeros((200, 412), np.uint8)  # built from the layout, not by rlfleet
    row[:, :12] = obs["speed"].astype(np.float32).view(np.uint8)
    row[:, 12:] = obs["frame"].reshape(200, -1)
    np.testing.assert_array_equal(row, algo.obs_layout.to_tensor(obs).numpy())
    expected = algo.predict(obs)
    assert len(np.unique(expected)) > 1
    _assert_same_actions(_run(path, {"obs": row}), expected)


class _Decode(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return float32_from_bytes(x)


def test_float_bytes_decode_to_the_same_bits_in_torch_and_onnxruntime(tmp_path: Path) -> None:
    """The arithmetic decode of bit-cast float features an exported graph runs: every bit
    pattern class (signed zeros, subnormals, the smallest and largest normals, infinities,
    NaNs and random words) comes back as ``view(torch.float32)`` gives it."""
    words = np.random.default_rng(4).integers(0, 2**32, (64, 16), dtype=np.uint64)
    words = words.astype(np.uint32)
    words[0] = [0, 0x80000000, 1, 0x807FFFFF, 0x00800000, 0x80800000, 0x7F7FFFFF, 0xFF7FFFFF,
                0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x3F800000, 0x00400000,
                0x7F000000, 0x01000000]  # fmt: skip
    x = torch.from_numpy(words.view(np.uint8).reshape(64, 64).copy())
    expected = x.view(torch.float32).numpy()
    path = tmp_path / "decode.onnx"
    with warnings.catch_warnings():  # the TorchScript exporter's deprecation, as export_onnx
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(_Decode(), (x,), str(path), dynamo=False, opset_version=OPSET,
                          input_names=["x"], output_names=["y"])  # fmt: skip
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for got in (float32_from_bytes(x).numpy(), session.run(["y"], {"x": x.numpy()})[0]):
        nan = np.isnan(expected)
        np.testing.assert_array_equal(np.isnan(got), nan)
        np.testing.assert_array_equal(got[~nan].view(np.uint32), expected[~nan].view(np.uint32))


RECURRENT = [
    name for name in list_algorithms()
    if "lstm_hidden_size" in {f.name for f in dataclasses.fields(get_algorithm(name).config_class)}
]  # fmt: skip
"""The algorithms that can be recurrent (a ``lstm_hidden_size`` setting)."""


@pytest.mark.parametrize("name", RECURRENT)
def test_recurrent_policies_are_refused(name: str, tmp_path: Path) -> None:
    """README and docs/export.md: recurrent policies are refused, whichever algorithm."""
    cls = get_algorithm(name)
    algo = cls(
        spaces.Box(-1.0, 1.0, (3,)), spaces.Discrete(2), cls.config_class(lstm_hidden_size=8)
    )
    with pytest.raises(ConfigError, match=r"recurrent policy.*feed-forward policies only"):
        algo.export_onnx(tmp_path / f"{name}.onnx")
    assert not (tmp_path / f"{name}.onnx").exists()
    assert len(RECURRENT) >= 4  # ppo, a2c, impala, appo


def test_mask_input_is_refused_where_masks_are_not_honoured(tmp_path: Path) -> None:
    bc = get_algorithm("bc")(spaces.Box(-1.0, 1.0, (3,)), spaces.Discrete(2))
    with pytest.raises(ConfigError, match="bc does not honour action masks"):
        bc.export_onnx(tmp_path / "bc.onnx", action_mask=True)
    ppo = PPO(spaces.Box(-1.0, 1.0, (3,)), spaces.Box(-1.0, 1.0, (2,)))
    with pytest.raises(ConfigError, match="cannot be masked"):
        ppo.export_onnx(tmp_path / "ppo.onnx", action_mask=True)


def test_export_changes_nothing_in_the_algorithm(tmp_path: Path) -> None:
    algo = _algorithm_for_short_run("ppo")
    before = algo.state_dict()
    modes = [m.training for module in algo.modules().values() for m in module.modules()]
    algo.export_onnx(tmp_path / "ppo.onnx")
    after = algo.state_dict()
    assert torch.equal(before["generator"], after["generator"])
    for key, state in before["modules"].items():
        for tensor_name, tensor in state.items():
            assert torch.equal(tensor, after["modules"][key][tensor_name])
    assert modes == [m.training for module in algo.modules().values() for m in module.modules()]


def test_a_model_that_cannot_be_written_is_a_run_dir_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk while saving the graph: a one-line RunDirError naming the file and the
    free space, and neither the model nor its temporary file is left."""
    algo = PPO(spaces.Box(-1.0, 1.0, (3,)), spaces.Discrete(2))

    def no_space(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(onnx, "save", no_space)
    with pytest.raises(RunDirError, match=r"ppo\.onnx: cannot write \(No space left on device; "):
        algo.export_onnx(tmp_path / "ppo.onnx")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "a-file").write_text("a file where the folder goes")
    with pytest.raises(RunDirError, match="cannot write"):
        algo.export_onnx(tmp_path / "a-file" / "ppo.onnx")
