"""On a mixed-quality Pendulum dataset (half scripted swing-up, half random torques), the
offline RL algorithms beat behavior cloning, which copies the mixture.

CI budgets: 3,000 gradient steps (batch 128) with the shipped presets' hyperparameters, CQL
lighter (2 sampled actions of each kind); bench/offline_pendulum.py runs the presets' full
budgets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlfleet.runs.config import default_run_config
from rlfleet.runs.run import make_trainer
from tests.offline.helpers import mixed_pendulum_dataset

BUDGETS: dict[str, tuple[int, dict[str, Any]]] = {
    "bc": (1500, {}),
    "cql": (3000, {"batch_size": 128, "num_sampled_actions": 2}),
    "iql": (3000, {"batch_size": 128}),
    "td3_bc": (3000, {}),
}
MARGIN = 150.0
"""How much higher than BC's each algorithm's best test return must be."""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = mixed_pendulum_dataset(30, 30)
    return data.save(tmp_path_factory.mktemp("pendulum") / "mixed")


def _best_return(algo: str, dataset: Path, target: float | None = None) -> float:
    """The best test return within the algorithm's budget; a run stops once it reaches
    ``target``."""
    steps, hyperparameters = BUDGETS[algo]
    cfg = default_run_config(
        algo,
        "Pendulum-v1",
        {
            "dataset": str(dataset),
            "seed": 0,
            "hyperparameters": hyperparameters,
            "env": {"num_test_envs": 10},
            "trainer": {
                "show_progress": False,
                "verbose": False,
                "max_steps": steps,
                "epoch_num_steps": 500,
                "test_step_num_episodes": 10,
                **({} if target is None else {"target_reward": target}),
            },
        },
    )
    trainer = make_trainer(cfg, None)
    try:
        return trainer.run().best_score
    finally:
        trainer.close()


@pytest.fixture(scope="module")
def bc_return(dataset: Path) -> float:
    return _best_return("bc", dataset)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["cql", "iql", "td3_bc"])
def test_offline_rl_beats_behavior_cloning(algo: str, dataset: Path, bc_return: float) -> None:
    score = _best_return(algo, dataset, target=bc_return + MARGIN)
    assert score >= bc_return + MARGIN, f"{algo}: {score:.1f}, bc: {bc_return:.1f}"
