"""Exact resume: N+M steps straight equals N steps, a new process, then M more — bitwise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlfleet.checkpoint import CheckpointManager, flatten_state

RUNS = {
    # name -> (algorithm, env id, flags, steps per epoch). CartPole runs on its native vector
    # env, Pendulum on a SyncVectorEnv of wrapped envs: both kinds of env state are saved and
    # restored. Off-policy runs also carry their replay buffer and sampler through the resume.
    "ppo-CartPole": (
        "ppo", "CartPole-v1", ["--num-steps", "32", "--num-envs", "4", "--batch-size", "64"], 1024
    ),
    "dqn-CartPole": (
        "dqn", "CartPole-v1", ["--num-envs", "2", "--learning-starts", "200",
                               "--buffer-size", "5000", "--batch-size", "32"], 512,
    ),
    "sac-Pendulum": (
        "sac", "Pendulum-v1", ["--num-envs", "1", "--learning-starts", "100", "--buffer-size",
                               "2000", "--batch-size", "32", "--hidden-sizes", "32", "32"], 128,
    ),
}  # fmt: skip


def _train(algo: str, *args: str) -> None:
    command = [
        sys.executable,
        "-m",
        "rlfleet.cli.main",
        "train",
        algo,
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
@pytest.mark.parametrize("name", list(RUNS))
def test_resume_in_a_new_process_is_bitwise_identical(name: str, tmp_path: Path) -> None:
    algo, env_id, flags, epoch = RUNS[name]
    # A test step of two episodes every epoch: the default cadence follows wall time (the
    # training is the same either way, but the evaluator's counters would follow the clock).
    common = ["--env", env_id, *flags, "--max-steps", str(4 * epoch), "--epoch-num-steps",
              str(epoch), "--test-interval-steps", "1", "--test-step-num-episodes", "2",
              "--target-reward", "None", "--deterministic"]  # fmt: skip
    straight, split = tmp_path / "straight", tmp_path / "split"
    _train(algo, *common, "--run-dir", str(straight))
    _train(algo, *common, "--max-epochs", "2", "--run-dir", str(split))
    _train(algo, "--resume", str(split), "--max-epochs", "None")

    a_tensors, a_skeleton, a_counters = _final_state(straight)
    b_tensors, b_skeleton, b_counters = _final_state(split)
    assert a_counters == b_counters
    assert a_skeleton == b_skeleton
    assert a_tensors.keys() == b_tensors.keys()
    different = [k for k in a_tensors if not torch.equal(a_tensors[k], b_tensors[k])]
    assert not different, different
