"""Exact resume: N+M steps straight equals N steps, a new process, then M more — bitwise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlfleet.train.checkpoint import CheckpointManager, flatten_state

RUNS = {
    # env id -> (flags, steps per epoch); CartPole runs on its native vector env, Pendulum on a
    # SyncVectorEnv of wrapped envs: both kinds of env state are saved and restored.
    "CartPole-v1": (["--num-steps", "32", "--num-envs", "4", "--batch-size", "64"], 1024),
    "Pendulum-v1": (["--num-steps", "64", "--num-envs", "2", "--batch-size", "64"], 1024),
}


def _train(*args: str) -> None:
    command = [
        sys.executable,
        "-m",
        "rlfleet.cli.main",
        "train",
        "ppo",
        *args,
        "--no-show-progress",
    ]
    subprocess.run(command, check=True, capture_output=True, timeout=300)


def _final_state(run_dir: Path) -> tuple[dict[str, torch.Tensor], object, dict[str, object]]:
    state, metadata = CheckpointManager(run_dir / "checkpoints").load_latest()
    tensors, skeleton = flatten_state(
        {k: state[k] for k in ("algorithm", "collector", "evaluator")}
    )
    return tensors, skeleton, metadata["counters"]


@pytest.mark.slow
@pytest.mark.parametrize("env_id", list(RUNS))
def test_resume_in_a_new_process_is_bitwise_identical(env_id: str, tmp_path: Path) -> None:
    flags, epoch = RUNS[env_id]
    common = ["--env", env_id, *flags, "--max-steps", str(4 * epoch), "--epoch-num-steps",
              str(epoch), "--target-reward", "None", "--deterministic"]  # fmt: skip
    straight, split = tmp_path / "straight", tmp_path / "split"
    _train(*common, "--run-dir", str(straight))
    _train(*common, "--max-epochs", "2", "--run-dir", str(split))
    _train("--resume", str(split), "--max-epochs", "None")

    a_tensors, a_skeleton, a_counters = _final_state(straight)
    b_tensors, b_skeleton, b_counters = _final_state(split)
    assert a_counters == b_counters
    assert a_skeleton == b_skeleton
    assert a_tensors.keys() == b_tensors.keys()
    different = [k for k in a_tensors if not torch.equal(a_tensors[k], b_tensors[k])]
    assert not different, different
