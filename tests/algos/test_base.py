"""``Algorithm.predict``: one observation or a batch, as Stable-Baselines3's ``predict``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gymnasium import spaces

from rlfleet.algos import PPO, PPOConfig
from rlfleet.errors import EnvSpecError
from rlfleet.nn.obs import batch_of_one

BOX = spaces.Box(-1.0, 1.0, (4,), np.float32)
IMAGE = spaces.Box(0, 255, (36, 36, 1), np.uint8)
OBSERVATION_SPACES: dict[str, spaces.Space[Any]] = {
    "box": BOX,
    "discrete": spaces.Discrete(5),
    "dict": spaces.Dict({"pos": BOX, "key": spaces.Discrete(3)}),
    "image": IMAGE,
}


def _ppo(observation_space: spaces.Space[Any], action_space: spaces.Space[Any]) -> PPO:
    return PPO(observation_space, action_space, PPOConfig(hidden_sizes=[16]), seed=0)


def _batch(space: spaces.Space[Any], n: int) -> Any:
    """``n`` samples of ``space`` stacked as a vector env returns them."""
    samples = [space.sample() for _ in range(n)]
    if isinstance(space, spaces.Dict):
        return {key: np.stack([s[key] for s in samples]) for key in space.spaces}
    return np.stack(samples)


def _row(batch: Any, i: int) -> Any:
    if isinstance(batch, dict):
        return {key: value[i] for key, value in batch.items()}
    return batch[i]


@pytest.mark.parametrize("name", OBSERVATION_SPACES)
@pytest.mark.parametrize(
    "action_space", [spaces.Discrete(3), spaces.Box(-2.0, 2.0, (2,), np.float32)], ids=str
)
def test_one_observation_gives_one_action_and_a_batch_a_batch(
    name: str, action_space: spaces.Space[Any]
) -> None:
    space = OBSERVATION_SPACES[name]
    space.seed(0)
    algo = _ppo(space, action_space)
    batch = _batch(space, 5)
    actions = algo.predict(batch)
    assert actions.shape == (5, *action_space.shape)
    for i in range(5):
        one = algo.predict(_row(batch, i))
        assert one.shape == action_space.shape
        assert action_space.contains(one)
        # Batched matrix products may round the last bit differently from a batch of one.
        np.testing.assert_allclose(one, actions[i], rtol=1e-5, atol=1e-6)
    # A batch of one is still a batch.
    assert algo.predict(batch_of_one(_row(batch, 0))).shape == (1, *action_space.shape)


def test_a_single_observation_takes_a_single_mask() -> None:
    algo = _ppo(BOX, spaces.Discrete(4))
    obs = BOX.sample()
    for legal in range(4):
        mask = np.eye(4, dtype=bool)[legal]
        assert int(algo.predict(obs, action_mask=mask)) == legal
        assert int(algo.predict(obs, action_mask=mask, deterministic=False)) == legal
    batch = np.stack([obs, obs, obs])
    masks = np.eye(4, dtype=bool)[[3, 1, 2]]
    np.testing.assert_array_equal(algo.predict(batch, action_mask=masks), [3, 1, 2])


def test_the_action_mask_key_of_a_dict_observation_is_honoured() -> None:
    space = spaces.Dict({"board": BOX, "action_mask": spaces.MultiBinary(4)})
    algo = _ppo(space, spaces.Discrete(4))
    for legal in range(4):
        obs = {"board": BOX.sample(), "action_mask": np.eye(4, dtype=np.int8)[legal]}
        assert int(algo.predict(obs, deterministic=False)) == legal
    batch = {"board": np.zeros((2, 4), np.float32), "action_mask": np.eye(4, dtype=np.int8)[[2, 0]]}
    np.testing.assert_array_equal(algo.predict(batch), [2, 0])


@pytest.mark.parametrize(
    ("space", "obs", "message"),
    [
        (BOX, np.zeros(5, np.float32), r"shape \(5,\) is neither one observation .*\(batch, 4\)"),
        (IMAGE, np.zeros((2, 2, 36, 36, 1), np.uint8), r"shape \(2, 2, 36, 36, 1\)"),
        (
            spaces.Dict({"pos": BOX, "key": spaces.Discrete(3)}),
            {"pos": np.zeros((2, 4), np.float32), "key": 1},
            r"parts \['pos'\] are batches but \['key'\] single observations",
        ),
        (
            spaces.Dict({"pos": BOX, "key": spaces.Discrete(3)}),
            {"pos": np.zeros(4, np.float32)},
            r"expected a dict with keys \['key', 'pos'\]",
        ),
    ],
    ids=["box", "image", "dict-mixed", "dict-keys"],
)
def test_an_observation_of_the_wrong_shape_is_refused_naming_it(
    space: spaces.Space[Any], obs: Any, message: str
) -> None:
    algo = _ppo(space, spaces.Discrete(2))
    with pytest.raises(EnvSpecError, match=message):
        algo.predict(obs)
