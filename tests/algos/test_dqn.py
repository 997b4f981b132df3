"""DQN: learns CartPole-v1 with its shipped preset; the update matches Stable-Baselines3's; flags;
learns from images through a CNN; refuses bad input clearly."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlfleet.algos import DQN, DQNConfig
from rlfleet.config.loader import validate
from rlfleet.data.replay import ReplayBuffer
from rlfleet.errors import ConfigError, EnvSpecError, InsufficientMemoryError
from rlfleet.nn.encoders import FlatEncoder, GridEncoder, ImageEncoder
from rlfleet.runs.config import default_run_config
from rlfleet.runs.run import make_trainer
from tests.nan_injection import assert_unchanged, optimizer_state
from tests.toy_envs import assert_bright_side_run_repeats_and_round_trips, bright_side_trainer

QUIET = {"show_progress": False, "verbose": False}
OBS = spaces.Box(-1, 1, (4,), np.float32)


def _trainer(overrides: dict[str, Any]) -> Any:
    return make_trainer(default_run_config("dqn", "CartPole-v1", overrides), None)


@pytest.mark.slow
def test_learns_cartpole() -> None:
    # The shipped preset reaches the threshold at a fixed seed within its 50k-step
    # budget (about 35k steps, 30 s of CPU time).
    trainer = _trainer({"seed": 0, "trainer": {**QUIET, "target_reward": 475}})
    result = trainer.run()
    assert result.best_score >= 475, result


@pytest.mark.parametrize(
    "flags",
    [
        {"double": True},
        {"dueling": True},
        {"n_step": 3},
        {"prioritized": True},
        {"double": True, "dueling": True, "n_step": 3, "prioritized": True},
    ],
)
def test_flags_train_without_error(flags: dict[str, Any]) -> None:
    trainer = _trainer(
        {
            "hyperparameters": {
                **flags,
                "learning_starts": 64,
                "batch_size": 16,
                "hidden_sizes": [16],
                "train_freq": 4,
                "gradient_steps": 1,
            },
            "env": {"num_envs": 2, "num_test_envs": 1},
            "trainer": {
                **QUIET,
                "max_steps": 400,
                "epoch_num_steps": 400,
                "test_step_num_episodes": 1,
            },
        }
    )
    result = trainer.run()
    assert result.gradient_steps > 0
    assert torch.isfinite(trainer.algorithm.parameters_vector()).all()


def test_prioritized_replay_updates_priorities() -> None:
    trainer = _trainer(
        {
            "hyperparameters": {
                "prioritized": True,
                "learning_starts": 64,
                "batch_size": 16,
                "train_freq": 4,
                "gradient_steps": 1,
            },
            "env": {"num_envs": 1, "num_test_envs": 1},
            "trainer": {
                **QUIET,
                "max_steps": 200,
                "epoch_num_steps": 200,
                "test_step_num_episodes": 1,
            },
        }
    )
    trainer.run()
    sampler = trainer.buffer.sampler
    assert sampler.max_priority != 1.0  # TD errors replaced the initial priority


def test_epsilon_falls_linearly_with_progress() -> None:
    algo = DQN(
        OBS, spaces.Discrete(2), DQNConfig(exploration_fraction=0.5, exploration_final_eps=0.1)
    )
    algo.set_progress(0.25)
    assert algo.exploration_rate() == pytest.approx(0.55)
    algo.set_progress(0.9)
    assert algo.exploration_rate() == pytest.approx(0.1)
    # Greedy actions ignore epsilon entirely.
    algo.set_progress(0.0)
    obs = torch.zeros(32, 4)
    greedy = algo.act(obs, deterministic=True).actions
    assert torch.equal(greedy, algo.act(obs, deterministic=True).actions)


def test_refuses_box_actions_naming_the_space_and_alternatives() -> None:
    with pytest.raises(
        EnvSpecError, match=r"dqn does not support action space Box.*ddpg.*sac.*td3"
    ):
        DQN(OBS, spaces.Box(-1, 1, (2,), np.float32))


def test_batch_larger_than_the_buffer_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"batch_size \(512\) is larger than the replay buffer"):
        _trainer({"hyperparameters": {"batch_size": 512, "buffer_size": 100}})


def test_negative_learning_rate_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"learning_rate.*greater than 0.*-0.001"):
        _trainer({"hyperparameters": {"learning_rate": -0.001}})


def test_buffer_that_does_not_fit_in_memory_is_refused() -> None:
    with pytest.raises(InsufficientMemoryError, match=r"needs [\d.]+ GiB, but only [\d.]+ GiB"):
        _trainer({"hyperparameters": {"buffer_size": 10**12}})


def test_discrete_spaces_that_do_not_start_at_zero() -> None:
    """``act`` gives indices; the env gets them shifted by ``start`` once."""
    algo = DQN(OBS, spaces.Discrete(3, start=-1), DQNConfig(exploration_initial_eps=1.0))
    indices = algo.act(torch.zeros(512, 4)).actions
    assert set(indices.tolist()) == {0, 1, 2}
    assert set(algo.env_actions(indices).tolist()) == {-1, 0, 1}
    assert set(algo.predict(np.zeros((8, 4), np.float32)).tolist()) <= {-1, 0, 1}


def test_update_matches_stable_baselines3() -> None:
    # Same initial weights, the same CartPole transitions (terminations, truncations and the
    # next-step autoreset rows between episodes) and the same minibatches: the stored
    # transitions are SB3's, and two blocks of gradient steps with a target copy between
    # them give SB3's parameters.
    import gymnasium as gym
    import stable_baselines3 as sb3
    from stable_baselines3.common.logger import configure
    from stable_baselines3.common.utils import polyak_update

    from rlfleet.data.replay import ReplayBuffer

    env = gym.make("CartPole-v1", max_episode_steps=15)
    hp = {"learning_rate": 2.3e-3, "batch_size": 16, "gamma": 0.99, "buffer_size": 1000}
    cfg = DQNConfig(**hp, hidden_sizes=(32, 32), target_update_interval=8)
    algo = DQN(env.observation_space, env.action_space, cfg, seed=0)
    theirs = sb3.DQN("MlpPolicy", env, **hp, policy_kwargs={"net_arch": [32, 32]}, seed=0)
    theirs.set_logger(configure(None, []))
    with torch.no_grad():
        for mine, other in zip(algo.q_net.parameters(), theirs.q_net.parameters(), strict=True):
            mine.copy_(other)
    algo.target_q_net.load_state_dict(algo.q_net.state_dict())
    polyak_update(theirs.q_net.parameters(), theirs.q_net_target.parameters(), 1.0)

    ours = ReplayBuffer(1000, env.observation_space, env.action_space)

    def add_row(obs: np.ndarray, action: int, reward: float, ended: str, valid: bool) -> None:
        ours.add(obs[None], np.array([action]), np.array([reward], np.float32),
                 np.array([ended == "terminated"]), np.array([ended == "truncated"]),
                 np.array([valid]))  # fmt: skip

    slots: list[int] = []
    ends = {"terminated": 0, "truncated": 0}
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=0)
    while len(slots) < 300:
        action = int(rng.integers(2))
        next_obs, reward, terminated, truncated, _ = env.step(action)
        # A step that both terminates and truncates is a termination, as SB3 records it.
        ended = "terminated" if terminated else "truncated" if truncated else ""
        slots.append(ours.pos)
        add_row(obs, action, float(reward), ended, valid=True)
        theirs.replay_buffer.add(obs[None], next_obs[None], np.array([action]),
                                 np.array([reward]), np.array([bool(ended)]),
                                 [{"TimeLimit.truncated": ended == "truncated"}])  # fmt: skip
        obs = next_obs
        if ended:
            ends[ended] += 1
            add_row(obs, 0, 0.0, "", valid=False)  # the reset step: the final observation
            obs, _ = env.reset()
    add_row(obs, 0, 0.0, "", valid=False)  # the next observation of the last transition
    assert ends["terminated"] > 3, ends
    assert ends["truncated"] > 3, ends
    slot_of = np.array(slots)

    every = np.arange(300)
    batches = [every, *(rng.integers(0, 300, 16) for _ in range(16))]
    ours_queue, theirs_queue = list(batches), list(batches)
    ours.sampler.sample = lambda *_: (slot_of[ours_queue.pop(0)], None)  # type: ignore[method-assign]
    theirs.replay_buffer.sample = lambda *_, **__: theirs.replay_buffer._get_samples(
        theirs_queue.pop(0)
    )
    mine_all, theirs_all = ours.sample(300, gamma=0.99), theirs.replay_buffer.sample(300)
    torch.testing.assert_close(mine_all.obs, theirs_all.observations)
    torch.testing.assert_close(mine_all.next_obs, theirs_all.next_observations)
    torch.testing.assert_close(mine_all.actions, theirs_all.actions.squeeze(1))
    torch.testing.assert_close(mine_all.rewards, theirs_all.rewards.squeeze(1).float())
    torch.testing.assert_close(mine_all.discounts, 0.99 * (1 - theirs_all.dones.squeeze(1)))
    for _ in range(2):
        algo.update(ours, num_gradient_steps=8)
        theirs.train(gradient_steps=8, batch_size=16)
        polyak_update(theirs.q_net.parameters(), theirs.q_net_target.parameters(), 1.0)
        for mine, other in zip(algo.q_net.parameters(), theirs.q_net.parameters(), strict=True):
            torch.testing.assert_close(mine, other, rtol=0, atol=1e-5)
        for mine, other in zip(
            algo.target_q_net.parameters(), theirs.q_net_target.parameters(), strict=True
        ):
            torch.testing.assert_close(mine, other, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "flags",
    [
        {},
        {"double": True, "n_step": 3},
        {"prioritized": True, "batch_size": 24},
        {"normalize_obs": True, "activation": "tanh", "tau": 0.5},
    ],
)
def test_written_out_backward_gives_autograds_parameters(flags: dict[str, Any]) -> None:
    # The update's gradients come from PlainMLP's kernels, not from loss.backward(): the
    # trained parameters must be bitwise those of the autograd update.
    def train(written_out: bool) -> tuple[torch.Tensor, torch.Tensor]:
        trainer = _trainer(
            {
                "seed": 3,
                "hyperparameters": {
                    "learning_starts": 64,
                    "batch_size": 16,
                    "hidden_sizes": [32, 32],
                    "train_freq": 8,
                    "gradient_steps": 4,
                    "target_update_interval": 6,
                    "learning_rate": 3e-3,
                    **flags,
                },
                "env": {"num_envs": 2, "num_test_envs": 1},
                "trainer": {
                    **QUIET,
                    "max_steps": 1200,
                    "epoch_num_steps": 1200,
                    "test_step_num_episodes": 1,
                    "target_reward": None,
                },
            }
        )
        algo = trainer.algorithm
        assert algo._plain_q is not None
        if not written_out:
            algo._plain_q = None
        result = trainer.run()
        assert result.gradient_steps > 200
        return algo.parameters_vector(), torch.cat(
            [p.flatten() for p in algo.target_q_net.parameters()]
        )

    mine, theirs = train(True), train(False)
    assert torch.equal(mine[0], theirs[0])
    assert torch.equal(mine[1], theirs[1])


def _small_trained() -> Any:
    """A trainer whose tiny DQN has taken a few gradient steps, its buffer filled."""
    trainer = _trainer(
        {
            "hyperparameters": {"learning_starts": 32, "batch_size": 8, "hidden_sizes": [8]},
            "env": {"num_envs": 1, "num_test_envs": 1},
            "trainer": {**QUIET, "max_steps": 64, "epoch_num_steps": 64, "target_reward": None},
        }
    )
    trainer.run()
    return trainer


@pytest.mark.parametrize("why", ["bf16", "hook"])
def test_bf16_products_and_hooks_take_autograd(why: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Under bf16 products the matmuls must go through precision's interception, and a hook
    # must run: neither happens on the written-out path, so the update takes autograd.
    import rlfleet.algos.dqn as dqn_module

    trainer = _small_trained()
    algo = trainer.algorithm
    hooked: list[bool] = []
    if why == "bf16":
        monkeypatch.setattr(dqn_module, "bf16_products_active", lambda: True)
    else:
        algo.q_net.q[0].weight.register_hook(lambda grad: hooked.append(True))

    def refuse(*_: Any) -> None:
        raise AssertionError("the written-out path ran")

    monkeypatch.setattr(algo, "_loss_and_gradients", refuse)
    algo.update(trainer.buffer, num_gradient_steps=2)
    assert algo._plain_q is not None
    assert hooked == ([True, True] if why == "hook" else [])


@pytest.mark.parametrize("nan_policy", ["raise", "skip_batch"])
def test_written_out_path_never_steps_on_a_non_finite_loss(nan_policy: str) -> None:
    # The shared NaN test poisons gradients through hooks, which send DQN's update through
    # autograd; this one poisons the replayed rewards, so the written-out path sees it.
    from rlfleet.errors import NonFiniteError

    trainer = _small_trained()
    algo = trainer.algorithm
    algo.nan_policy = nan_policy
    assert algo._plain_q is not None
    trainer.buffer.storage.rewards[:] = np.nan
    before = algo.parameters_vector().clone()
    steps = algo.gradient_steps
    state = optimizer_state([algo.optimizer])
    assert state, "the optimiser should have state from training"
    if nan_policy == "raise":
        with pytest.raises(NonFiniteError, match="non-finite loss"):
            algo.update(trainer.buffer, num_gradient_steps=3)
    else:
        algo.update(trainer.buffer, num_gradient_steps=3)
        assert algo.skipped_batches == 3
    assert torch.equal(algo.parameters_vector(), before)
    assert algo.gradient_steps == steps
    assert_unchanged(state, optimizer_state([algo.optimizer]), "optimizer state")


def test_dueling_and_compiled_updates_take_autograd(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlfleet.nn.compile import INDUCTOR_CACHE_ENV

    monkeypatch.setenv(INDUCTOR_CACHE_ENV, str(tmp_path))  # compile_update points it there
    dueling = DQN(OBS, spaces.Discrete(2), DQNConfig(dueling=True), seed=0)
    assert dueling._plain_q is None
    plain = DQN(OBS, spaces.Discrete(2), DQNConfig(), seed=0)
    assert plain._plain_q is not None
    plain.compile_update()  # torch.compile wraps lazily: nothing is compiled here
    assert plain._plain_q is None


def _image_trainer(steps: int, seed: int = 0) -> Any:
    """DQN with the Nature CNN on BrightSide (36x36 uint8 frames: a bright square on the
    left or the right; reward 1 for naming its side), 4 envs, 1-step episodes."""
    config = validate(
        DQNConfig,
        {
            "hidden_sizes": [],
            "learning_rate": 5e-4,
            "learning_starts": 256,
            "batch_size": 64,
            "buffer_size": 4096,
            "train_freq": 4,
            "gradient_steps": 1,
            "target_update_interval": 50,
            "exploration_fraction": 0.5,
            "gamma": 0.0,
        },
        "dqn",
    )
    return bright_side_trainer(DQN, config, steps, seed)


@pytest.mark.slow
def test_learns_from_images_with_a_cnn() -> None:
    # Random play scores 0.5; the Q-network sees only the pixels.
    trainer = _image_trainer(3072)
    assert isinstance(trainer.algorithm.q_net.encoder, ImageEncoder)
    score = trainer.run().best_score
    assert score >= 0.9, score


def test_cnn_q_network_round_trips_a_checkpoint_and_repeats_with_its_seed(tmp_path: Any) -> None:
    assert_bright_side_run_repeats_and_round_trips(lambda: _image_trainer(512), tmp_path)


def test_normalize_obs_is_refused_for_images() -> None:
    image = spaces.Box(0, 255, (36, 36, 1), np.uint8)
    with pytest.raises(ConfigError, match="normalize_obs applies to vector observations"):
        DQN(image, spaces.Discrete(2), DQNConfig(normalize_obs=True))


@pytest.mark.parametrize("cnn", ["nature", "impala", "minatar"])
def test_each_cnn_gives_q_values_of_every_action(cnn: str) -> None:
    image = spaces.Box(0, 255, (4, 36, 36), np.uint8)
    algo = DQN(image, spaces.Discrete(5), DQNConfig(cnn=cnn, hidden_sizes=()))
    obs = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (3, 4, 36, 36), np.uint8))
    assert algo.q_net(algo.preprocess(obs)).shape == (3, 5)
    assert algo.predict(obs.numpy()).shape == (3,)


def test_binary_grids_go_through_the_minatar_cnn_only_when_asked() -> None:
    grid = spaces.Box(0, 1, (10, 10, 4), np.bool_)
    flat = DQN(grid, spaces.Discrete(3), DQNConfig(hidden_sizes=(32,)))
    assert isinstance(flat.q_net.encoder, FlatEncoder)
    assert flat.q_net.encoder.out_features == 400
    cnn = DQN(grid, spaces.Discrete(3), DQNConfig(cnn="minatar", hidden_sizes=()), seed=3)
    assert isinstance(cnn.q_net.encoder, GridEncoder)
    assert cnn.q_net.encoder.out_features == 128
    obs = np.random.default_rng(0).integers(0, 2, (6, 10, 10, 4)).astype(np.bool_)
    assert cnn.predict(obs).shape == (6,)
    # Its gradients go through autograd (the CNN's parameters learn too), not PlainMLP.
    assert cnn._plain_q is None
    buffer = ReplayBuffer(64, grid, spaces.Discrete(3))
    rng = np.random.default_rng(1)
    for _ in range(40):
        buffer.add(
            rng.integers(0, 2, (1, 10, 10, 4)).astype(np.bool_),
            rng.integers(0, 3, (1,)),
            rng.normal(size=1).astype(np.float32),
            np.zeros(1, np.bool_),
            np.zeros(1, np.bool_),
            np.ones(1, np.bool_),
        )
    conv = cnn.q_net.encoder.cnn.convs[0].weight
    before = conv.detach().clone()
    cnn.update(buffer, batch_size=8)
    assert not torch.equal(before, conv.detach())
