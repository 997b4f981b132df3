"""Recording datasets with a policy: what the policy and the random actions may choose."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from rlfleet.algos import PPO
from rlfleet.collect.record import record_dataset
from tests.toy_envs import MaskedPick

MASKED_ID = "rlfleet-tests/MaskedPickInfo-v0"


def test_recorded_actions_are_legal_under_the_env_mask() -> None:
    if MASKED_ID not in gym.registry:
        gym.register(MASKED_ID, entry_point=MaskedPick)
    env = MaskedPick()
    algo = PPO(env.observation_space, env.action_space)
    dataset = record_dataset(algo, MASKED_ID, 600, epsilon=0.5, deterministic=False, seed=3)
    # MaskedPick's observation is the mask of the step: each recorded action must be legal.
    legal = dataset.observations[np.arange(len(dataset)), dataset.actions.astype(int)]
    assert len(dataset) == 600
    assert legal.all(), f"{int((legal == 0).sum())} illegal actions recorded"
