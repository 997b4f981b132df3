"""ML-Agents' trainer methods on OnPolicyTrainer and OffPolicyTrainer, called as ML-Agents
documents them, each checked by its effect on the one training loop."""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
from gymnasium import spaces

from rlfleet.algos.dqn import DQN, DQNConfig
from rlfleet.algos.ppo import PPO, PPOConfig
from rlfleet.algos.sac import SAC, SACConfig
from rlfleet.checkpoint import CheckpointManager
from rlfleet.envs.make import make_vec_env
from rlfleet.errors import CheckpointError, ConfigError
from rlfleet.train.loop import TrainerConfig
from rlfleet.train.mlagents_api import REPLAY_BUFFER_FILE, behavior_spec_to_spaces
from rlfleet.train.trainer import OffPolicyTrainer, OnPolicyTrainer


# The records of mlagents_envs.base_env and mlagents.trainers.behavior_id_utils, field for field.
class ObservationSpec(NamedTuple):
    shape: tuple[int, ...]
    dimension_property: tuple[int, ...]
    observation_type: int
    name: str


class ActionSpec(NamedTuple):
    continuous_size: int
    discrete_branches: tuple[int, ...]


class BehaviorSpec(NamedTuple):
    observation_specs: list[ObservationSpec]
    action_spec: ActionSpec


class BehaviorIdentifiers(NamedTuple):
    behavior_id: str
    brain_name: str
    team_id: int


CARTPOLE_ID = BehaviorIdentifiers("CartPole?team=0", "CartPole", 0)
CARTPOLE_SPEC = BehaviorSpec([ObservationSpec((4,), (1,), 0, "VectorSensor")], ActionSpec(0, (2,)))


@pytest.fixture
def _onnx() -> None:
    """save_model's ONNX file needs the onnx extra."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")


def _config(max_steps: int, **extra: Any) -> TrainerConfig:
    return TrainerConfig(max_steps=max_steps, show_progress=False, verbose=False, **extra)


def _ppo_trainer(
    max_steps: int = 256, run_dir: Path | None = None, seed: int = 0, **ppo: Any
) -> OnPolicyTrainer:
    envs = make_vec_env("CartPole-v1", 2, seed=seed)
    cfg = PPOConfig(num_steps=32, num_epochs=2, batch_size=32, hidden_sizes=(16,), **ppo)
    algo = PPO(envs.single_observation_space, envs.single_action_space, cfg, seed=seed)
    return OnPolicyTrainer(
        algo, envs, None, _config(max_steps, epoch_num_steps=max_steps), run_dir=run_dir, seed=seed
    )


def _dqn_trainer(run_dir: Path | None = None, learning_starts: int = 40) -> OffPolicyTrainer:
    envs = make_vec_env("CartPole-v1", 2, seed=0)
    cfg = DQNConfig(
        buffer_size=500, learning_starts=learning_starts, batch_size=16, hidden_sizes=(16,)
    )
    algo = DQN(envs.single_observation_space, envs.single_action_space, cfg, seed=0)
    return OffPolicyTrainer(algo, envs, None, _config(2_000), run_dir=run_dir, seed=0)


def test_create_policy_returns_the_trainers_algorithm_and_add_get_policy_file_it() -> None:
    trainer = _ppo_trainer()
    policy = trainer.create_policy(CARTPOLE_ID, CARTPOLE_SPEC)
    assert policy is trainer.algorithm
    assert trainer.policies == {}  # creating does not add, as in ML-Agents
    trainer.add_policy(CARTPOLE_ID, policy)
    assert trainer.get_policy("CartPole?team=0") is policy
    trainer.add_policy("Other?team=1", trainer.create_policy("Other?team=1", _gym_spaces()))
    assert trainer.get_policy("Other?team=1") is policy
    assert list(trainer.policies) == ["CartPole?team=0", "Other?team=1"]


def _gym_spaces() -> tuple[spaces.Space[Any], spaces.Space[Any]]:
    return spaces.Box(-1.0, 1.0, (4,), np.float32), spaces.Discrete(2)


def test_create_policy_refuses_a_spec_of_other_spaces() -> None:
    trainer = _ppo_trainer()
    continuous = CARTPOLE_SPEC._replace(action_spec=ActionSpec(1, ()))
    with pytest.raises(ConfigError, match=r"actions are Box.*built for Discrete\(2\)"):
        trainer.create_policy(CARTPOLE_ID, continuous)
    wider = CARTPOLE_SPEC._replace(observation_specs=[ObservationSpec((5,), (1,), 0, "v")])
    with pytest.raises(ConfigError, match="observations"):
        trainer.create_policy(CARTPOLE_ID, wider)


def test_add_policy_refuses_another_algorithm_and_get_policy_an_unknown_id() -> None:
    trainer = _ppo_trainer()
    stranger = PPO(*_gym_spaces())
    with pytest.raises(ConfigError, match="not another PPO object"):
        trainer.add_policy(CARTPOLE_ID, stranger)
    with pytest.raises(
        ConfigError, match=r"no policy was added for behavior 'Nope' \(added: none\)"
    ):
        trainer.get_policy("Nope")


def test_behavior_spec_maps_to_gymnasium_spaces() -> None:
    spec = BehaviorSpec(
        [
            ObservationSpec((8,), (1,), 0, "RayPerception"),
            ObservationSpec((84, 84, 3), (1, 1, 0), 0, "Camera"),
        ],
        ActionSpec(0, (3, 2)),
    )
    obs, act = behavior_spec_to_spaces(spec)
    assert isinstance(obs, spaces.Dict)
    assert obs["RayPerception"] == spaces.Box(-np.inf, np.inf, (8,), np.float32)
    assert obs["Camera"] == spaces.Box(0.0, 1.0, (84, 84, 3), np.float32)
    assert act == spaces.MultiDiscrete([3, 2])
    unnamed = spec._replace(observation_specs=[s._replace(name="") for s in spec.observation_specs])
    assert isinstance(obs := behavior_spec_to_spaces(unnamed)[0], spaces.Dict)
    assert set(obs.keys()) == {"obs_0", "obs_1"}
    _, act = behavior_spec_to_spaces(spec._replace(action_spec=ActionSpec(2, ())))
    assert act == spaces.Box(-1.0, 1.0, (2,), np.float32)
    assert behavior_spec_to_spaces(_gym_spaces()) == _gym_spaces()
    with pytest.raises(ConfigError, match="one kind of action space"):
        behavior_spec_to_spaces(spec._replace(action_spec=ActionSpec(2, (3,))))
    with pytest.raises(ConfigError, match="no actions"):
        behavior_spec_to_spaces(spec._replace(action_spec=ActionSpec(0, ())))
    with pytest.raises(ConfigError, match="no observation_specs"):
        behavior_spec_to_spaces(spec._replace(observation_specs=[]))


def test_advance_takes_one_training_step_until_max_steps() -> None:
    trainer = _ppo_trainer(max_steps=160)
    assert trainer.get_step == 0
    assert trainer.get_max_steps == 160
    assert trainer.should_still_train
    for expected in (64, 128, 192):  # rollouts of 32 steps x 2 envs
        gradient_steps = trainer.algorithm.gradient_steps
        trainer.advance()
        assert trainer.get_step == expected
        assert trainer.algorithm.gradient_steps == gradient_steps + 2 * 2  # 2 epochs x 2 batches
    assert not trainer.should_still_train  # 192 >= 160: the budget is spent
    trainer.advance()
    assert trainer.get_step == 192
    assert trainer.algorithm.gradient_steps == 12


def test_should_still_train_flips_exactly_at_max_steps() -> None:
    trainer = _ppo_trainer(max_steps=128)
    trainer.advance()
    assert trainer.should_still_train
    trainer.advance()
    assert trainer.get_step == trainer.get_max_steps == 128
    assert not trainer.should_still_train


def test_advance_computes_what_run_computes() -> None:
    """advance() is the loop's own training step: as many of them as run() takes give the
    same parameters."""
    stepped = _ppo_trainer(max_steps=256, seed=3)
    while stepped.should_still_train:
        stepped.advance()
    ran = _ppo_trainer(max_steps=256, seed=3)
    result = ran.run()
    assert result.env_steps == stepped.get_step == 256
    assert np.array_equal(
        ran.algorithm.parameters_vector().numpy(), stepped.algorithm.parameters_vector().numpy()
    )
    assert list(ran.reward_buffer) == list(stepped.reward_buffer)


def test_reward_buffer_holds_finished_episodes_returns_newest_first() -> None:
    trainer = _ppo_trainer(max_steps=2_000)
    assert trainer.reward_buffer == deque()
    while len(trainer.recent_returns) < 3:
        trainer.advance()
    buffer = trainer.reward_buffer
    assert buffer.maxlen == 20
    assert list(buffer) == list(reversed(trainer.recent_returns))
    # CartPole pays 1 per step: each finished episode's return is its length.
    assert list(buffer) == [float(n) for n in reversed(trainer.recent_lengths)]
    buffer.clear()  # a snapshot: the trainer's own record is untouched
    assert len(trainer.reward_buffer) >= 3


def test_end_episode_starts_new_episodes_and_drops_unfinished_returns() -> None:
    trainer = _ppo_trainer()
    trainer.advance()
    collector = trainer.collector
    assert collector is not None
    assert collector.tracker.lengths.any()  # episodes under way
    trainer.end_episode()
    assert not collector.tracker.lengths.any()
    assert not collector.tracker.returns.any()
    trainer.advance()  # training goes on from the new episodes
    assert trainer.get_step == 128


def test_end_episode_starts_a_recurrent_policy_from_a_fresh_state() -> None:
    trainer = _ppo_trainer(lstm_hidden_size=8)
    trainer.advance()
    assert trainer.collector is not None
    runner = trainer.collector.runner
    assert runner.state is not None
    assert runner.state.abs().sum() > 0
    trainer.end_episode()
    assert runner.state.abs().sum() == 0


def test_end_episode_never_pairs_the_last_stored_step_with_a_new_episode() -> None:
    trainer = _dqn_trainer()
    trainer.advance()
    buffer = trainer.buffer
    newest = (buffer.pos - 1) % buffer.rows
    assert buffer.storage.valid[newest].all()
    trainer.end_episode()
    assert not buffer.storage.valid[newest].any()


def _onnx_actions(path: Path, obs: np.ndarray) -> np.ndarray:
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(str(path))
    (actions,) = session.run(["actions"], {"obs": obs.astype(np.float32)})
    return np.asarray(actions)


@pytest.mark.usefixtures("_onnx")
def test_save_model_writes_a_checkpoint_and_the_behaviors_onnx_policy(tmp_path: Path) -> None:
    trainer = _ppo_trainer(run_dir=tmp_path)
    trainer.add_policy(CARTPOLE_ID, trainer.create_policy(CARTPOLE_ID, CARTPOLE_SPEC))
    trainer.advance()
    trainer.save_model()
    latest = CheckpointManager(tmp_path / "checkpoints").latest()
    assert latest is not None
    assert latest.name == "step-000000000064"
    obs = np.random.default_rng(0).uniform(-2, 2, (200, 4)).astype(np.float32)
    actions = _onnx_actions(tmp_path / "CartPole.onnx", obs)
    assert np.array_equal(actions, trainer.algorithm.predict(obs))


@pytest.mark.usefixtures("_onnx")
def test_save_model_names_the_onnx_file_after_the_algorithm_without_a_behavior(
    tmp_path: Path,
) -> None:
    trainer = _ppo_trainer(run_dir=tmp_path)
    trainer.save_model()
    assert (tmp_path / "ppo.onnx").is_file()


@pytest.mark.usefixtures("_onnx")
def test_save_model_of_a_continuous_off_policy_trainer(tmp_path: Path) -> None:
    envs = make_vec_env("Pendulum-v1", 1, seed=0)
    cfg = SACConfig(buffer_size=200, learning_starts=20, batch_size=16, hidden_sizes=(16,))
    algo = SAC(envs.single_observation_space, envs.single_action_space, cfg, seed=0)
    trainer = OffPolicyTrainer(algo, envs, None, _config(100), run_dir=tmp_path, seed=0)
    trainer.add_policy("Pendulum?team=0", algo)
    for _ in range(30):
        trainer.advance()
    assert algo.gradient_steps > 0
    trainer.save_model()
    state, _ = CheckpointManager(tmp_path / "checkpoints").load_latest()
    assert state["replay_buffer"]["rows_filled"] == 30  # save_replay_buffer is on by default
    obs = np.random.default_rng(1).uniform(-1, 1, (200, 3)).astype(np.float32)
    actions = _onnx_actions(tmp_path / "Pendulum.onnx", obs)
    np.testing.assert_allclose(actions, algo.predict(obs), atol=1e-5)


@pytest.mark.usefixtures("_onnx")
def test_save_model_of_a_recurrent_policy_warns_that_no_onnx_is_written(tmp_path: Path) -> None:
    trainer = _ppo_trainer(run_dir=tmp_path, lstm_hidden_size=8)
    with pytest.warns(RuntimeWarning, match="no ppo.onnx: ppo has a recurrent policy"):
        trainer.save_model()
    assert CheckpointManager(tmp_path / "checkpoints").latest() is not None
    assert not (tmp_path / "ppo.onnx").exists()


def test_save_model_needs_a_run_dir() -> None:
    with pytest.raises(ConfigError, match="save_model writes into the run directory"):
        _ppo_trainer().save_model()


def test_replay_buffer_round_trips_through_save_and_load(tmp_path: Path) -> None:
    trainer = _dqn_trainer(run_dir=tmp_path)
    for _ in range(40):
        trainer.advance()
    trainer.save_replay_buffer()
    assert (tmp_path / REPLAY_BUFFER_FILE).is_file()
    fresh = _dqn_trainer(run_dir=tmp_path, learning_starts=0)
    assert len(fresh.buffer) == 0
    fresh.load_replay_buffer()
    saved, loaded = trainer.buffer, fresh.buffer
    assert (
        (loaded.pos, loaded.rows_filled) == (saved.pos, saved.rows_filled) == (80, 80)
    )  # rows of 2 envs
    for key, array in saved.storage.arrays().items():
        if key != "valid":
            assert np.array_equal(loaded.storage.arrays()[key], array), key
    # The loaded stream ends there: its last step is not followed by the envs' next one.
    valid_saved, valid_loaded = saved.storage.valid, loaded.storage.valid
    assert np.array_equal(valid_loaded[:79], valid_saved[:79])
    assert not valid_loaded[79].any()
    fresh.advance()  # a trainer that needs no warm-up learns from them at once
    assert fresh.algorithm.gradient_steps > 0


def test_replay_buffer_files_need_a_run_dir_and_an_existing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="save_replay_buffer uses the run directory"):
        _dqn_trainer().save_replay_buffer()
    with pytest.raises(CheckpointError):
        _dqn_trainer(run_dir=tmp_path).load_replay_buffer()


def test_threaded_follows_the_setting_and_replay_buffer_methods_are_off_policy_only() -> None:
    assert _ppo_trainer().threaded is False
    assert _dqn_trainer().threaded is False
    envs = make_vec_env("CartPole-v1", 2, seed=0)
    algo = DQN(envs.single_observation_space, envs.single_action_space, DQNConfig(), seed=0)
    threaded = OffPolicyTrainer(algo, envs, None, _config(2_000, threaded=True))
    assert threaded.threaded is True
    assert not hasattr(OnPolicyTrainer, "save_replay_buffer")
    assert hasattr(OffPolicyTrainer, "load_replay_buffer")
