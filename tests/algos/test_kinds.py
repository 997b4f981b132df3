"""The contracts of the algorithm kinds: every registered algorithm declares its kind's, its
config has every field the trainers read, and trainers refuse the other kinds."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces

from rlfleet.algos import PPO, SAC, get_algorithm, list_algorithms
from rlfleet.algos.kinds import (
    ActorLearnerHyperparameters,
    OfflineHyperparameters,
    OffPolicyHyperparameters,
    OnPolicyHyperparameters,
    contract_of,
    declares_contract,
    is_off_policy,
    is_on_policy,
    require_kind,
)
from rlfleet.data.samplers import UniformSampler
from rlfleet.errors import ConfigError

HYPERPARAMETERS: dict[str, type[Any]] = {
    "on_policy": OnPolicyHyperparameters,
    "off_policy": OffPolicyHyperparameters,
    "offline": OfflineHyperparameters,
    "distributed": ActorLearnerHyperparameters,
}
BOX = spaces.Box(-1.0, 1.0, (3,), np.float32)


def _fields(protocol: type[Any]) -> list[str]:
    return [name for name, value in vars(protocol).items() if isinstance(value, property)]


@pytest.mark.parametrize("name", list_algorithms())
def test_every_algorithm_declares_the_contract_of_its_kind(name: str) -> None:
    cls = get_algorithm(name)
    assert declares_contract(cls)
    assert contract_of(cls.kind) in cls.__bases__


@pytest.mark.parametrize("name", list_algorithms())
def test_every_config_has_the_fields_its_trainer_reads(name: str) -> None:
    cls = get_algorithm(name)
    config = cls.config_class()
    fields = _fields(HYPERPARAMETERS[cls.kind])
    assert fields
    missing = [field for field in fields if not hasattr(config, field)]
    assert not missing, f"{name}'s config lacks {missing}"


def test_added_fields_keep_the_behaviour_they_stand_for() -> None:
    """Fields a config gained for its contract default to what the trainers assumed."""
    assert get_algorithm("sac").config_class().n_step == 1
    assert get_algorithm("td3").config_class().n_step == 1
    assert get_algorithm("ddpg").config_class().n_step == 1
    acer = get_algorithm("acer").config_class()
    assert (acer.batch_size, acer.num_epochs, acer.gae_lambda) == (None, None, 0.95)
    assert get_algorithm("impala").config_class().batch_size is None


def test_update_signatures_follow_the_contract() -> None:
    on_policy = inspect.signature(get_algorithm("ppo").update).parameters
    assert {"batch_size", "num_repetitions"} <= set(on_policy)
    off_policy = inspect.signature(get_algorithm("sac").update).parameters
    assert {"batch_size", "num_gradient_steps"} <= set(off_policy)


def test_require_kind_returns_the_contract_or_refuses_other_kinds() -> None:
    ppo = PPO(BOX, spaces.Discrete(2))
    assert require_kind(ppo, "on_policy", "needs on-policy") is ppo
    assert is_on_policy(ppo)
    assert not is_off_policy(ppo)
    with pytest.raises(ConfigError, match=r"^needs off-policy, got ppo \(on_policy\)$"):
        require_kind(ppo, "off_policy", "needs off-policy")


def test_off_policy_algorithms_choose_their_replay_sampler() -> None:
    sac = SAC(BOX, spaces.Box(-1.0, 1.0, (1,), np.float32))
    assert isinstance(sac.replay_sampler(), UniformSampler)
    dqn_cls = get_algorithm("dqn")
    dqn = dqn_cls(BOX, spaces.Discrete(2), dqn_cls.config_class(prioritized=True))
    assert type(dqn.replay_sampler()).__name__ == "PrioritizedSampler"
