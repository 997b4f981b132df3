"""``bench/compare.py``: in the identical setting rlfleet's side runs the comparison's
hyperparameters and the algorithm's own defaults, never the env's shipped preset; ``--bf16``
adds rlfleet with bf16 products to the pairs."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

from rlfleet.algos.registry import get_algorithm
from rlfleet.config.loader import preset, to_dict
from rlfleet.runs.config import default_run_config


@pytest.mark.parametrize("name", ["ppo_cartpole", "dqn_cartpole", "sac_pendulum"])
def test_identical_runs_take_no_hyperparameter_from_the_envs_preset(
    bench_module: Callable[[str], ModuleType], name: str
) -> None:
    compare = bench_module("compare")
    spec = bench_module(name).SPEC
    given = spec.rlfleet_hyperparameters
    hyperparameters = compare.identical_hyperparameters(spec.algo, given)
    cfg = default_run_config(spec.algo, spec.env_id, {"hyperparameters": hyperparameters})
    expected = get_algorithm(spec.algo).config_class(**given)
    assert to_dict(cfg.hyperparameters) == to_dict(expected)


def test_a_preset_value_the_comparison_leaves_out_is_the_default(
    bench_module: Callable[[str], ModuleType],
) -> None:
    # DQN's CartPole preset takes 3-step returns; RL-Zoo's set, and SB3, take 1-step ones.
    assert preset("dqn", "CartPole-v1")["hyperparameters"]["n_step"] == 3
    spec = bench_module("dqn_cartpole").SPEC
    assert "n_step" not in spec.rlfleet_hyperparameters
    hyperparameters = bench_module("compare").identical_hyperparameters("dqn", {})
    cfg = default_run_config("dqn", "CartPole-v1", {"hyperparameters": hyperparameters})
    assert cfg.hyperparameters.n_step == 1


class _Stop(Exception):
    """Ends ``main`` once the call a test looks at has been made."""


def test_bf16_times_rlfleet_with_bf16_products_beside_the_others(
    bench_module: Callable[[str], ModuleType], monkeypatch: pytest.MonkeyPatch
) -> None:
    compare = bench_module("compare")
    spec = bench_module("ppo_cartpole").SPEC
    seen: dict[str, Any] = {}

    def run_pairs(script: Any, cases: Any, contenders: Any, pairs: int, threads: Any) -> None:
        seen["contenders"] = [c.label for c in contenders]
        raise _Stop

    monkeypatch.setattr(compare, "run_pairs", run_pairs)
    monkeypatch.setattr(sys, "argv", ["ppo_cartpole.py", "--bf16", "--mode", "identical"])
    with pytest.raises(_Stop):
        compare.main(spec, None)
    assert seen["contenders"] == ["rlfleet", "sb3", "rlfleet (bf16)"]

    # Its worker process runs rlfleet with the trainer setting, and nothing else differs.
    def rlfleet_run(*args: Any, trainer_settings: dict[str, Any] | None, **kwargs: Any) -> None:
        seen["settings"] = trainer_settings
        raise _Stop

    monkeypatch.setattr(compare, "rlfleet_run", rlfleet_run)
    monkeypatch.setattr(compare, "start_worker", lambda threads: None)
    for worker, settings in [("rlfleet-bf16", {"precision": "bf16"}), ("rlfleet", None)]:
        argv = ["ppo_cartpole.py", "--worker", worker, "--mode", "identical", "--result", "r"]
        monkeypatch.setattr(sys, "argv", argv)
        with pytest.raises(_Stop):
            compare.main(spec, None)
        assert seen["settings"] == settings
