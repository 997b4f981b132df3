"""Action masks: no discrete policy ever takes a masked action, in training or evaluation;
off-policy targets bootstrap from legal next actions only; bad masks are refused with the
env index and step."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from torch import nn

from rlfleet.algos import DQN, SAC, DQNConfig, SACConfig, get_algorithm, list_algorithms
from rlfleet.algos.cql import CQL, CQLConfig
from rlfleet.algos.registry import algorithms_supporting_masks
from rlfleet.collect.evaluator import Evaluator
from rlfleet.config.loader import validate
from rlfleet.errors import CheckpointError, EnvSpecError
from rlfleet.train.loop import TrainerConfig
from rlfleet.train.trainer import OffPolicyTrainer, OnPolicyTrainer, Trainer
from rlfleet.types import ReplayBatch
from tests.algos.test_spaces import FAST
from tests.toy_envs import MaskedPick

KINDS = {"discrete": "Discrete", "multi_discrete": "MultiDiscrete", "multi_binary": "MultiBinary"}

# Off-policy settings that learn MaskedPick in a few thousand steps.
OFF_POLICY_FAST: dict[str, dict[str, Any]] = {
    "dqn": {
        "learning_starts": 200,
        "batch_size": 64,
        "hidden_sizes": [64],
        "learning_rate": 1e-3,
        "target_update_interval": 100,
        "exploration_fraction": 0.3,
    },
    "sac": {
        "learning_starts": 200,
        "batch_size": 64,
        "hidden_sizes": [64],
        "learning_rate": 1e-3,
        "train_freq": 4,
    },
}


def _vector(envs: list[MaskedPick]) -> SyncVectorEnv:
    return SyncVectorEnv([lambda e=e: e for e in envs], autoreset_mode=AutoresetMode.NEXT_STEP)


def _cases() -> list[Any]:
    cases = []
    # The on-policy family through OnPolicyTrainer, DQN and discrete SAC through
    # OffPolicyTrainer (random warm-up included); each with the mask sources its observation
    # spaces allow (a mask in the observation makes it a Dict).
    for name in list_algorithms():
        cls = get_algorithm(name)
        if cls.kind != "on_policy" and name not in OFF_POLICY_FAST:
            continue
        for kind, space in KINDS.items():
            if any(t.__name__ == space for t in cls.action_spaces):
                for in_obs in (False, True):
                    if not isinstance(
                        MaskedPick(kind, in_obs).observation_space, cls.observation_spaces
                    ):
                        continue
                    where = "obs" if in_obs else "info"
                    cases.append(pytest.param(name, kind, in_obs, id=f"{name}-{kind}-{where}"))
    return cases


def _masked_trainer(
    name: str, train: list[MaskedPick], test: list[MaskedPick], steps: int, **kwargs: Any
) -> Trainer:
    envs, test_envs = _vector(train), _vector(test)
    cls = get_algorithm(name)
    on_policy = cls.kind == "on_policy"
    hyperparameters = FAST[name] if on_policy else OFF_POLICY_FAST[name]
    config = validate(cls.config_class, hyperparameters, name)
    algo = cls(envs.single_observation_space, envs.single_action_space, config, seed=0)
    trainer_class = OnPolicyTrainer if on_policy else OffPolicyTrainer
    return trainer_class(
        algo,
        envs,
        test_envs,
        TrainerConfig(
            max_steps=steps,
            epoch_num_steps=kwargs.pop("epoch_num_steps", steps),
            test_step_num_episodes=10,
            show_progress=False,
            verbose=False,
        ),
        seed=0,
        **kwargs,
    )


@pytest.mark.parametrize(("name", "kind", "mask_in_obs"), _cases())
def test_no_masked_action_is_ever_taken(name: str, kind: str, mask_in_obs: bool) -> None:
    train = [MaskedPick(kind, mask_in_obs) for _ in range(4)]
    test = [MaskedPick(kind, mask_in_obs) for _ in range(2)]
    trainer = _masked_trainer(name, train, test, 3072)
    algo = trainer.algorithm
    test_envs = trainer.test_envs
    trainer.run()
    Evaluator(test_envs, algo, seed=1).run(10, deterministic=False)
    taken = sum(env.steps for env in train + test)
    assert taken > 2500
    assert sum(env.violations for env in train + test) == 0


def test_every_algorithm_that_supports_masks_is_checked_above() -> None:
    checked = {case.values[0] for case in _cases()}
    assert checked == set(algorithms_supporting_masks())


# Algorithms that act only in Box spaces never see a mask: the PolicyRunner refuses those.
@pytest.mark.parametrize(
    "name",
    [
        name
        for name in list_algorithms()
        if not get_algorithm(name).supports_masks
        and spaces.Discrete in get_algorithm(name).action_spaces
    ],
)
def test_an_algorithm_without_mask_support_refuses_a_mask(name: str) -> None:
    cls = get_algorithm(name)
    algo = cls(spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(4))
    obs = algo.preprocess(np.zeros((2, 3), np.float32))
    mask = torch.tensor([[True, False, True, False]] * 2)
    with pytest.raises(EnvSpecError, match=f"{name} does not support action masks"):
        algo.act(obs, action_mask=mask)


@pytest.mark.slow
def test_masked_policy_learns_the_best_legal_action() -> None:
    from tests.algos.test_spaces import train_on

    score = train_on("ppo", lambda: MaskedPick("discrete"), FAST["ppo"], 8192)
    # 5 steps per episode, reward 1 for the highest legal action: random legal play scores
    # about 2.
    assert score >= 4.5


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OFF_POLICY_FAST))
def test_off_policy_learns_the_best_legal_action(name: str) -> None:
    train = [MaskedPick("discrete") for _ in range(4)]
    test = [MaskedPick("discrete") for _ in range(4)]
    trainer = _masked_trainer(name, train, test, 4000, epoch_num_steps=1000)
    assert isinstance(trainer, OffPolicyTrainer)
    assert trainer.buffer.mask_size == 5
    result = trainer.run()
    assert result.best_score >= 4.5  # random legal play scores about 2
    assert sum(env.violations for env in train + test) == 0


class _Unmasked(MaskedPick):
    """MaskedPick's spaces without its mask: every action is allowed."""

    def _obs_info(self) -> tuple[Any, dict[str, Any]]:
        obs, _ = super()._obs_info()
        return obs, {}


def test_masked_replay_buffer_resumes_and_a_buffer_without_masks_is_refused(
    tmp_path: Path,
) -> None:
    def trainer(env: type[MaskedPick], run_dir: Path, steps: int, resume: bool) -> Any:
        return _masked_trainer(
            "dqn",
            [env() for _ in range(2)],
            [env()],
            steps,
            epoch_num_steps=256,
            run_dir=run_dir,
            resume_from_log=resume,
        )

    trainer(MaskedPick, tmp_path / "masked", 256, False).run()
    first = trainer(MaskedPick, tmp_path / "masked", 256, True)
    saved = first.buffer.action_masks[: first.buffer.rows_filled].copy()
    assert first.buffer.rows_filled == 128
    assert not saved.all()  # the env's masks, not a fresh all-true array
    resumed = trainer(MaskedPick, tmp_path / "masked", 512, True)
    resumed.run()
    np.testing.assert_array_equal(resumed.buffer.action_masks[:128], saved)

    trainer(_Unmasked, tmp_path / "plain", 256, False).run()
    with pytest.raises(CheckpointError, match="replay buffer state holds no action masks"):
        trainer(MaskedPick, tmp_path / "plain", 512, True)


# --------------------------------------------------------------------- learning targets
OBS = spaces.Box(-1, 1, (2,), np.float32)
LEGAL_NEXT = [[True, False, True], [False, False, False]]
"""Next-state masks of a two-transition batch: action 1 illegal; then a terminal state with
no legal action at all (its discount is 0)."""


class _Fixed(nn.Module):
    """A network whose outputs a test sets: the same row(s) for every observation."""

    def __init__(self, *rows: list[float]) -> None:
        super().__init__()
        self.rows = [torch.tensor(row) for row in rows]

    def forward(self, obs: torch.Tensor) -> Any:
        out = tuple(row.expand(obs.shape[0], -1) for row in self.rows)
        return out[0] if len(out) == 1 else out


def _batch(next_masks: list[list[bool]] | None) -> ReplayBatch[torch.Tensor]:
    """Reward 1 for both transitions; discounts 0.5 and 0 (terminated)."""
    return ReplayBatch(
        obs=torch.zeros(2, 2),
        actions=torch.zeros(2, dtype=torch.int64),
        rewards=torch.ones(2),
        next_obs=torch.zeros(2, 2),
        discounts=torch.tensor([0.5, 0.0]),
        weights=torch.ones(2),
        indices=np.arange(2),
        action_masks=None if next_masks is None else torch.ones(2, 3, dtype=torch.bool),
        next_action_masks=None if next_masks is None else torch.tensor(next_masks),
    )


@pytest.mark.parametrize("double", [False, True])
def test_dqn_target_ignores_illegal_next_actions(double: bool) -> None:
    algo = DQN(OBS, spaces.Discrete(3), DQNConfig(hidden_sizes=(4,), double=double))
    # The illegal action 1 has the largest target Q-value, and the online network (double
    # DQN's chooser) prefers it too; among legal actions it prefers 2.
    algo.target_q_net = _Fixed([4.0, 5.0, 2.0])
    algo.q_net = _Fixed([0.0, 9.0, 3.0])
    _, _, target = algo._loss(_batch(LEGAL_NEXT))
    legal_value = 2.0 if double else 4.0
    torch.testing.assert_close(target, torch.tensor([1 + 0.5 * legal_value, 1.0]))
    _, _, unmasked = algo._loss(_batch(None))
    torch.testing.assert_close(unmasked, torch.tensor([1 + 0.5 * 5.0, 1.0]))


def test_discrete_sac_target_expectation_ignores_illegal_next_actions() -> None:
    algo = SAC(OBS, spaces.Discrete(3), SACConfig(hidden_sizes=(4,), ent_coef=0.5))
    algo.actor = _Fixed([0.0, 3.0, 0.0])  # the illegal action is the policy's favourite
    algo.critic_target = _Fixed([1.0, 10.0, 2.0], [1.5, 12.0, 2.0])
    alpha = torch.tensor([0.5])
    next_obs = torch.zeros(2, 2)
    target = algo._discrete_target(_batch(LEGAL_NEXT), next_obs, alpha)
    # pi(.|s') is uniform over actions 0 and 2: E[min Q - alpha log pi] = 1.5 + 0.5 log 2.
    legal_value = 1.5 + 0.5 * math.log(2)
    torch.testing.assert_close(target, torch.tensor([1 + 0.5 * legal_value, 1.0]))
    unmasked = algo._discrete_target(_batch(None), next_obs, alpha)
    assert unmasked[0] > target[0] + 1  # the illegal action's 10 would dominate
    # With masks the default target entropy is per state: that fraction of log(legal).
    masks = torch.tensor([[True, False, True], [False, True, False]])
    torch.testing.assert_close(
        algo._discrete_target_entropy(masks), torch.tensor([0.5 * math.log(2), 0.0])
    )
    assert algo._discrete_target_entropy(None) == pytest.approx(0.5 * math.log(3))


def test_discrete_cql_target_ignores_illegal_next_actions() -> None:
    algo = CQL(OBS, spaces.Discrete(3), CQLConfig(hidden_sizes=(4,)))
    algo.q_target = _Fixed([4.0, 5.0, 2.0])
    next_obs = torch.zeros(2, 2)
    torch.testing.assert_close(
        algo._discrete_target(_batch(LEGAL_NEXT), next_obs), torch.tensor([3.0, 1.0])
    )
    torch.testing.assert_close(
        algo._discrete_target(_batch(None), next_obs), torch.tensor([3.5, 1.0])
    )


class _BadMask(MaskedPick):
    """At its 3rd step: gives an all-false mask (``empty``), one of the wrong width (``wide``)
    or none (``missing``)."""

    def __init__(self, fault: str) -> None:
        super().__init__("discrete", length=50)
        self.fault = fault
        self.count = 0

    def _obs_info(self) -> tuple[Any, dict[str, Any]]:
        obs, info = super()._obs_info()
        self.count += 1
        if self.count == 3:
            if self.fault == "missing":
                del info["action_mask"]
            else:
                info["action_mask"] = np.ones(7 if self.fault == "wide" else 5, np.int8)
                info["action_mask"][:] = self.fault == "wide"
        return obs, info


BAD_MASKS = {
    "empty": r"env index 1 at step 2 allows no action",
    "wide": r"env index 0 at step 2: expected 5 entries",
    "missing": r"env index 1 gave no 'action_mask' in its info at step 2 while other envs did",
}


@pytest.mark.parametrize("fault", list(BAD_MASKS))
@pytest.mark.parametrize("where", ["training", "evaluation"])
def test_each_bad_mask_is_refused_naming_env_and_step(fault: str, where: str) -> None:
    """docs/spaces.md: each check is an EnvSpecError naming the env index and the step, in
    training (the collector) and in evaluation."""
    from rlfleet.collect.collector import Collector
    from rlfleet.data.rollout import RolloutStorage

    # A vector env cannot batch masks of two widths, so the wide one comes alone.
    good = [] if fault == "wide" else [MaskedPick("discrete", length=50)]
    envs = _vector([*good, _BadMask(fault)])
    algo = get_algorithm("ppo")(envs.single_observation_space, envs.single_action_space)
    storage = RolloutStorage(8, envs.num_envs, algo.obs_layout.shape, algo.action_shape)

    def run() -> None:
        if where == "training":
            Collector(envs, algo, seed=0).collect_rollout(storage)
        else:
            Evaluator(envs, algo, seed=0).run(2)

    with pytest.raises(EnvSpecError, match=BAD_MASKS[fault]):
        run()


def test_mask_for_box_actions_is_refused() -> None:
    from rlfleet.nn.masks import check_mask

    with pytest.raises(EnvSpecError, match="Discrete, MultiDiscrete and MultiBinary"):
        check_mask(np.ones((1, 2), bool), 1, None, 0)
