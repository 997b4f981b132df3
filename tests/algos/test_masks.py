"""Action masks: no discrete policy ever takes a masked action, in training or evaluation,
and bad masks are refused with the env index and step."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from rlfleet.algos import get_algorithm, list_algorithms
from rlfleet.collect.evaluator import Evaluator
from rlfleet.config.loader import validate
from rlfleet.errors import EnvSpecError
from rlfleet.train.trainer import OnPolicyTrainer, TrainerConfig
from tests.algos.test_spaces import FAST
from tests.toy_envs import MaskedPick

KINDS = {"discrete": "Discrete", "multi_discrete": "MultiDiscrete", "multi_binary": "MultiBinary"}


def _vector(envs: list[MaskedPick]) -> SyncVectorEnv:
    return SyncVectorEnv([lambda e=e: e for e in envs], autoreset_mode=AutoresetMode.NEXT_STEP)


def _cases() -> list[Any]:
    cases = []
    # Driven through OnPolicyTrainer: the on-policy family. DQN and discrete SAC honour masks
    # through the same `act(action_mask=...)` path, exercised by the multi-agent tests.
    for name in list_algorithms():
        cls = get_algorithm(name)
        if cls.kind != "on_policy":
            continue
        for kind, space in KINDS.items():
            if any(t.__name__ == space for t in cls.action_spaces):
                for in_obs in (False, True):
                    where = "obs" if in_obs else "info"
                    cases.append(pytest.param(name, kind, in_obs, id=f"{name}-{kind}-{where}"))
    return cases


@pytest.mark.parametrize(("name", "kind", "mask_in_obs"), _cases())
def test_no_masked_action_is_ever_taken(name: str, kind: str, mask_in_obs: bool) -> None:
    train = [MaskedPick(kind, mask_in_obs) for _ in range(4)]
    test = [MaskedPick(kind, mask_in_obs) for _ in range(2)]
    envs, test_envs = _vector(train), _vector(test)
    cls = get_algorithm(name)
    config = validate(cls.config_class, FAST[name], name)
    algo = cls(envs.single_observation_space, envs.single_action_space, config, seed=0)
    trainer = OnPolicyTrainer(
        algo,
        envs,
        test_envs,
        TrainerConfig(
            max_steps=3072,
            epoch_num_steps=3072,
            test_step_num_episodes=10,
            show_progress=False,
            verbose=False,
        ),
        seed=0,
    )
    trainer.run()
    Evaluator(test_envs, algo, seed=1).run(10, deterministic=False)
    taken = sum(env.steps for env in train + test)
    assert taken > 2500
    assert sum(env.violations for env in train + test) == 0


def test_masked_policy_learns_the_best_legal_action() -> None:
    from tests.algos.test_spaces import train_on

    score = train_on("ppo", lambda: MaskedPick("discrete"), FAST["ppo"], 8192)
    # 5 steps per episode, reward 1 for the highest legal action: random legal play scores
    # about 2.
    assert score >= 4.5


class _BadMask(MaskedPick):
    """Gives an all-false mask (or one of the wrong width) at its 3rd step."""

    def __init__(self, wrong_width: bool) -> None:
        super().__init__("discrete", length=50)
        self.wrong_width = wrong_width
        self.count = 0

    def _obs_info(self) -> tuple[Any, dict[str, Any]]:
        obs, info = super()._obs_info()
        self.count += 1
        if self.count == 3:
            info["action_mask"] = np.ones(7, np.int8) if self.wrong_width else np.zeros(5, np.int8)
        return obs, info


def test_all_false_mask_names_env_and_step() -> None:
    envs = _vector([MaskedPick("discrete", length=50), _BadMask(wrong_width=False)])
    algo = get_algorithm("ppo")(envs.single_observation_space, envs.single_action_space)
    from rlfleet.collect.collector import Collector
    from rlfleet.data.rollout import RolloutStorage

    storage = RolloutStorage(8, 2, algo.obs_layout.shape, algo.action_shape)
    with pytest.raises(EnvSpecError, match=r"env index 1 at step 2 allows no action"):
        Collector(envs, algo, seed=0).collect_rollout(storage)


def test_wrong_mask_shape_is_refused() -> None:
    envs = _vector([_BadMask(wrong_width=True)])
    algo = get_algorithm("a2c")(envs.single_observation_space, envs.single_action_space)
    with pytest.raises(EnvSpecError, match=r"env index 0 at step 2: expected 5 entries"):
        Evaluator(envs, algo, seed=0).run(1)


def test_mask_for_box_actions_is_refused() -> None:
    from rlfleet.nn.masks import check_mask

    with pytest.raises(EnvSpecError, match="Discrete, MultiDiscrete and MultiBinary"):
        check_mask(np.ones((1, 2), bool), 1, None, 0)
