"""A long run's resident memory stays flat: nothing grows per step or per update."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlfleet.runs.config import default_run_config
from rlfleet.runs.run import make_trainer


def resident_mib() -> float:
    """This process's resident memory, MiB."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs /proc")
def test_resident_memory_is_flat_over_many_updates(tmp_path: Path) -> None:
    cfg = default_run_config(
        "ppo",
        "CartPole-v1",
        {
            "env": {"num_envs": 8, "num_test_envs": 2},
            "hyperparameters": {"num_steps": 16, "num_epochs": 1, "batch_size": 128},
            "trainer": {
                "max_steps": 128 * 1500,
                "epoch_num_steps": 128 * 150,
                "target_reward": None,
                "test_step_num_episodes": 2,
                "show_progress": False,
                "verbose": False,
            },
        },
    )
    samples: list[float] = []

    def sample(epoch: int, env_step: int) -> None:
        if env_step % (128 * 100) == 0:
            samples.append(resident_mib())

    trainer = make_trainer(cfg, tmp_path / "run", training_fn=sample)
    trainer.run()
    # 1500 updates, 10 checkpoints; measured after the first 300 updates have warmed up
    # allocator caches.
    warm, end = samples[3], samples[-1]
    assert len(samples) >= 14
    assert end - warm < 15.0, f"RSS grew from {warm:.1f} MB to {end:.1f} MB: {samples}"
