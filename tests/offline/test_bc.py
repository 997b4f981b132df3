"""Behavior cloning learns an expert CartPole policy from a recorded dataset."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlfleet.collect.record import record_dataset
from rlfleet.runs.config import default_run_config
from rlfleet.runs.run import make_trainer, train

QUIET = {"show_progress": False, "verbose": False}


@pytest.mark.slow
def test_bc_clones_a_trained_ppo_policy_on_cartpole(tmp_path: Path) -> None:
    ppo = make_trainer(default_run_config("ppo", "CartPole-v1", {"trainer": QUIET}), None)
    try:
        assert ppo.run().best_score >= 475
    finally:
        ppo.close()
    dataset = record_dataset(ppo.algorithm, "CartPole-v1", 20_000, seed=1)
    # The median: the last episode, cut at 20k transitions, is short whatever the policy.
    assert dataset.stats().return_median >= 475
    dataset.save(tmp_path / "data")
    cfg = default_run_config(
        "bc",
        "CartPole-v1",
        {"dataset": str(tmp_path / "data"), "trainer": QUIET, "seed": 1},
    )
    result = train(cfg, tmp_path / "run")
    assert result.best_score >= 475, result
    assert result.stop_reason.startswith("stop_fn")
    # The run logged the dataset's statistics first.
    import pyarrow.parquet as pq

    history = pq.read_table(tmp_path / "run" / "history.parquet").to_pylist()
    assert history[0]["dataset/num_transitions"] == 20_000
    assert history[0]["dataset/return_median"] >= 475
