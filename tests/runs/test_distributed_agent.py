"""RLLTE's ``DistributedAgent`` surface: env forms, documented defaults, ``batch_size`` and
``hidden_dim``, ``run``/``update`` in this process, and reward-free pre-training.

Most tests run the actor and learner steps in this process; the last ones train through Ray
on one module-wide local cluster (started by the first of them).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.envs.classic_control import CartPoleEnv

from rlfleet.checkpoint import CheckpointManager, load_checkpoint
from rlfleet.checkpoint.schema import PolicyMetadata, PolicyState
from rlfleet.distributed.actors import build_vec_env, policy_weights
from rlfleet.distributed.trainer import DistributedTrainer
from rlfleet.errors import ConfigError, EnvSpecError
from rlfleet.logging.history import read_history
from rlfleet.runs import distributed_agent
from rlfleet.runs.distributed_agent import DistributedAgent

SMALL: dict[str, Any] = {"num_actors": 1, "num_learners": 1, "num_steps": 8, "seed": 3}


def _scaled_cartpole(scale: float) -> Any:
    def make() -> gym.Env[Any, Any]:
        return gym.wrappers.TransformReward(gym.make("CartPole-v1"), lambda r: scale * r)

    return make


def _params(agent: DistributedAgent) -> list[torch.Tensor]:
    assert agent.algorithm is not None
    return [p.detach().clone() for m in agent.algorithm.modules().values() for p in m.parameters()]


# ------------------------------------------------------------ env forms
def test_env_id_and_registered_vector_envs_travel_as_ids() -> None:
    agent = DistributedAgent("CartPole-v1", **SMALL)
    assert agent.env_source.env_id == "CartPole-v1"
    assert agent.env_source.factory is None

    single = DistributedAgent(gym.make("CartPole-v1", max_episode_steps=60), **SMALL)
    assert single.config.env.kwargs == {"max_episode_steps": 60}
    assert single.config.env.num_envs == 8  # the preset's: an env fixes no count

    native = DistributedAgent(gym.make_vec("CartPole-v1", num_envs=3), **SMALL)
    assert native.env_source.factory is None
    assert native.config.env.num_envs == 3

    sync = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1", max_episode_steps=50)] * 2)
    agent = DistributedAgent(sync, **SMALL)
    assert (agent.config.env.id, agent.config.env.kwargs) == (
        "CartPole-v1",
        {"max_episode_steps": 50},
    )
    assert agent.config.env.num_envs == 2

    asynchronous = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="async")
    agent = DistributedAgent(asynchronous, **SMALL)
    asynchronous.close()
    assert agent.env_source.factory is None
    assert agent.config.env.num_envs == 2

    pendulum = gym.make_vec("Pendulum-v1", num_envs=2, vectorization_mode="sync", g=9.0)
    agent = DistributedAgent(pendulum, **SMALL)
    assert agent.config.env.kwargs == {"g": 9.0}
    envs = build_vec_env(agent.env_source, 2)
    assert envs.get_attr("g") == (9.0, 9.0)
    envs.close()


def test_a_spec_with_wrappers_travels_as_the_spec() -> None:
    wrapped = gym.vector.SyncVectorEnv(
        [lambda: gym.wrappers.TimeAwareObservation(gym.make("CartPole-v1"))] * 2
    )
    agent = DistributedAgent(wrapped, **SMALL)
    assert agent.env_source.factory is not None
    envs = build_vec_env(agent.env_source, 2)
    # TimeAwareObservation adds the time to CartPole's 4 numbers.
    assert envs.single_observation_space.shape == (5,)
    envs.close()
    given = gym.make_vec("CartPole-v1", 2, "sync", wrappers=[gym.wrappers.TimeAwareObservation])
    envs = build_vec_env(DistributedAgent(given, **SMALL).env_source, 2)
    assert envs.single_observation_space.shape == (5,)
    envs.close()


class _Corridor(gym.Env[np.ndarray, np.int64]):
    """Walk right to the end of a corridor of 4 cells."""

    observation_space = gym.spaces.Box(0, 3, (1,))
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        self.cell = 0
        return np.zeros(1, np.float32), {}

    def step(self, action: Any) -> Any:
        self.cell = max(0, self.cell + (1 if action else -1))
        return np.full(1, self.cell, np.float32), float(self.cell == 3), self.cell == 3, False, {}


def test_a_vector_env_of_an_env_registered_here_travels_as_its_spec() -> None:
    gym.register("Corridor-v0", entry_point=_Corridor, max_episode_steps=20)
    try:
        envs = gym.vector.SyncVectorEnv([lambda: gym.make("Corridor-v0")] * 2)
        agent = DistributedAgent(envs, **SMALL)
    finally:
        del gym.registry["Corridor-v0"]
    assert agent.env_source.factory is not None
    # Rebuilt without the registry entry, as in an actor's process.
    rebuilt = build_vec_env(agent.env_source, 2, seed=0)
    assert rebuilt.single_observation_space == _Corridor.observation_space
    rebuilt.close()


def test_factories_of_envs_and_of_vector_envs_are_taken() -> None:
    agent = DistributedAgent(_scaled_cartpole(2.0), num_envs=2, **SMALL)
    assert agent.env_source.env_id == "CartPole-v1"
    assert agent.config.env.num_envs == 2

    def vector() -> Any:
        return gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync")

    agent = DistributedAgent(vector, **SMALL)
    assert agent.config.env.num_envs == 4
    envs = build_vec_env(agent.env_source, 1)
    assert envs.num_envs == 4
    envs.close()


class _Unregistered(gym.Env[np.ndarray, int]):
    observation_space = gym.spaces.Box(-1, 1, (2,))
    action_space = gym.spaces.Discrete(2)


REFUSED: dict[str, tuple[Any, str]] = {
    "unregistered": (lambda: gym.vector.SyncVectorEnv([_Unregistered] * 2), "has no spec"),
    "mixed": (
        lambda: gym.vector.SyncVectorEnv(
            [lambda: gym.make("CartPole-v1"), lambda: gym.make("CartPole-v1", max_episode_steps=9)]
        ),
        "sub-envs of the SyncVectorEnv differ",
    ),
    "async-with-wrappers": (
        lambda: gym.make_vec(
            "CartPole-v1", 2, "async", wrappers=[gym.wrappers.TimeAwareObservation]
        ),
        "records wrappers given to gym.make_vec",
    ),
    "not-an-env": (lambda: lambda: 3, "the factory returned a int"),
    "int": (lambda: 42, "expected an env id, a gymnasium.vector.VectorEnv"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_envs_that_cannot_travel_are_refused_at_construction(case: str) -> None:
    build, match = REFUSED[case]
    env = build()
    try:
        with pytest.raises(EnvSpecError, match=match):
            DistributedAgent(env, **SMALL)
    finally:
        if isinstance(env, gym.vector.VectorEnv):
            env.close()


def test_an_unserialisable_factory_is_refused_for_actors_but_not_for_tests() -> None:
    pytest.importorskip("ray")
    lock = threading.Lock()

    def make() -> gym.Env[Any, Any]:
        with lock:
            return gym.make("CartPole-v1")

    with pytest.raises(
        EnvSpecError,
        match=r"env: .* factory cannot be serialised \(cannot pickle .*lock.*in: factory -> lock\)",
    ):
        DistributedAgent(make, **SMALL)
    agent = DistributedAgent("CartPole-v1", eval_env=make, **SMALL)
    assert agent.eval(1).returns.size == 1


def test_num_envs_other_than_the_vector_envs_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"num_envs \(2\) differs from the 3 envs"):
        DistributedAgent(gym.make_vec("CartPole-v1", num_envs=3), num_envs=2, **SMALL)


# ------------------------------------------------------------- defaults
def test_agent_on_a_small_machine_starts_fewer_actors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(distributed_agent, "_available_cpus", lambda address: 4)
    with pytest.warns(UserWarning, match="documented default") as caught:
        agent = DistributedAgent("CartPole-v1")
    assert [str(w.message).split(":")[0] for w in caught] == ["num_learners", "num_actors"]
    assert "documented default 45 needs more than the 4 CPUs available; using 3" in str(
        caught[1].message
    )
    assert agent.config.distributed is not None
    assert (agent.config.distributed.num_actors, agent.config.distributed.num_learners) == (3, 1)
    assert agent.config.distributed.storages == 60


# ------------------------------------------- batch_size and hidden_dim
def test_batch_size_and_hidden_dim_keep_rlltes_meaning() -> None:
    agent = DistributedAgent("CartPole-v1", batch_size=3, hidden_dim=32, num_envs=2, **SMALL)
    hp = agent.config.hyperparameters
    assert (hp.batch_fragments, hp.hidden_sizes) == (3, (32, 32))
    agent.run("CartPole-v1", 0, num_fragments=5)
    metrics = agent.update()
    assert "loss/policy" in metrics
    assert len(agent.storages) == 2  # one learner batch took batch_size rollouts
    assert agent.algorithm is not None
    net = agent.algorithm.modules()["net"]
    # Actor and critic side by side ([2, in, out]): CartPole's 4 inputs, 32, 32, outputs.
    shapes = [tuple(p.shape) for name, p in net.named_parameters() if "weights" in name]
    assert shapes[:2] == [(2, 4, 32), (2, 32, 32)]
    appo = DistributedAgent("CartPole-v1", algo="appo", minibatch_size=64, batch_size=4, **SMALL)
    assert (
        appo.config.hyperparameters.batch_size,
        appo.config.hyperparameters.batch_fragments,
    ) == (
        64,
        4,
    )


def test_use_lstm_gives_a_recurrent_policy_as_wide_as_hidden_dim() -> None:
    agent = DistributedAgent("CartPole-v1", use_lstm=True, hidden_dim=32, num_envs=2, **SMALL)
    assert agent.config.hyperparameters.lstm_hidden_size == 32
    assert DistributedAgent("CartPole-v1", **SMALL).config.hyperparameters.lstm_hidden_size is None
    agent.run("CartPole-v1", 0, num_fragments=2)
    assert "loss/policy" in agent.update()
    with pytest.raises(ConfigError, match="use_lstm and lstm_hidden_size both given"):
        DistributedAgent("CartPole-v1", use_lstm=True, lstm_hidden_size=16, **SMALL)


def test_rllte_and_rlfleet_names_of_one_setting_together_are_refused() -> None:
    with pytest.raises(ConfigError, match="batch_size and batch_fragments both given"):
        DistributedAgent("CartPole-v1", batch_size=2, batch_fragments=4, **SMALL)


# ----------------------------------------------------------- run/update
def test_run_fills_free_storages_and_update_consumes_a_batch() -> None:
    agent = DistributedAgent("CartPole-v1", num_storages=3, num_envs=2, batch_size=2, **SMALL)
    infos = agent.run(gym.make_vec("CartPole-v1", num_envs=2), 1)
    assert [info.actor for info in infos] == [1, 1, 1]  # until every storage is full
    assert all(info.policy_version == 0 for info in infos)
    assert agent.run("CartPole-v1", 0) == []
    before = _params(agent)
    agent.update()
    assert len(agent.storages) == 1
    assert agent.policy_version == 1
    assert any(not torch.equal(a, b) for a, b in zip(before, _params(agent), strict=True))
    # With too few full storages, update() has actor 0 fill them first.
    agent.update()
    assert agent.storages == []
    assert agent.policy_version == 2
    infos = agent.run("CartPole-v1", 0, num_fragments=1)
    assert infos[0].policy_version == 2
    assert infos[0].stats.env_steps == 16


def test_run_refuses_an_env_unlike_the_agents() -> None:
    agent = DistributedAgent("CartPole-v1", num_envs=2, **SMALL)
    with pytest.raises(EnvSpecError, match="has 3 envs, the agent's actors 2"):
        agent.run(gym.make_vec("CartPole-v1", num_envs=3), 0)
    agent.update()
    with pytest.raises(EnvSpecError, match="observation space"):
        agent.run("Acrobot-v1", 0)


# ----------------------------------------------------------- pretraining
def _updated(scale: float, *, pretraining: bool) -> tuple[list[torch.Tensor], dict[str, float]]:
    agent = DistributedAgent(_scaled_cartpole(scale), num_envs=2, pretraining=pretraining, **SMALL)
    metrics = agent.update()
    metrics.update(agent.update())
    return _params(agent), metrics


def test_pretraining_never_sees_the_env_reward() -> None:
    """Scaling the env reward by 100 changes nothing when pre-training (the loss sees the
    intrinsic reward alone), and changes the update when it is not."""
    plain, metrics = _updated(1.0, pretraining=True)
    scaled, _ = _updated(100.0, pretraining=True)
    assert all(torch.equal(a, b) for a, b in zip(plain, scaled, strict=True))
    assert metrics["train/intrinsic_rnd_reward"] > 0
    assert "loss/rnd" in metrics
    plain, _ = _updated(1.0, pretraining=False)
    scaled, _ = _updated(100.0, pretraining=False)
    assert any(not torch.equal(a, b) for a, b in zip(plain, scaled, strict=True))


def test_intrinsic_reward_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="intrinsic_reward must be 'rnd' or 'curiosity'"):
        DistributedAgent("CartPole-v1", pretraining=True, intrinsic_reward="icm", **SMALL)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="need num_learners 1"):
        DistributedAgent("CartPole-v1", pretraining=True, num_actors=1, num_learners=2)
    monkeypatch.setattr(distributed_agent, "_available_cpus", lambda address: 64)
    agent = DistributedAgent("CartPole-v1", pretraining=True)
    assert agent.config.distributed is not None
    assert (agent.config.distributed.num_actors, agent.config.distributed.num_learners) == (45, 1)


# ----------------------------------------------------------- through Ray
class _HerePole(CartPoleEnv):
    """CartPole under a class of this module."""


@pytest.mark.usefixtures("ray_cluster")
def test_pretraining_then_fine_tuning_from_its_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pre-training on a factory's env (each actor rebuilds it), logging the intrinsic reward;
    then fine-tuning on a vector env of an env registered only here, starting from the
    pre-trained weights."""
    train = {"eval_interval": 1024, "save_interval": 1024, "num_eval_episodes": 1}
    pre = DistributedAgent(
        _scaled_cartpole(1.0),
        pretraining=True,
        intrinsic_reward="curiosity",
        run_dir=tmp_path / "pre",
        num_envs=2,
        **SMALL,
    )
    pre.train(2048, **train)
    rows = read_history(tmp_path / "pre" / "history.parquet")
    assert any(row.get("train/intrinsic_curiosity_reward") for row in rows)

    latest = CheckpointManager(tmp_path / "pre" / "checkpoints", readonly=True).latest()
    assert latest is not None
    state, _ = load_checkpoint(latest, state_schema=PolicyState, metadata_schema=PolicyMetadata)
    pretrained = state["algorithm"]["modules"]["net"]
    started_from: list[dict[str, torch.Tensor]] = []
    broadcast = DistributedTrainer.broadcast_weights

    def spy(self: DistributedTrainer) -> None:
        started_from.append(policy_weights(self.algorithm, 0).modules["net"])
        broadcast(self)

    monkeypatch.setattr(DistributedTrainer, "broadcast_weights", spy)
    # Registered in this process only: the actors rebuild the env from its spec.
    gym.register("HerePole-v0", entry_point=_HerePole, max_episode_steps=500)
    try:
        here = gym.vector.SyncVectorEnv([lambda: gym.make("HerePole-v0")] * 2)
        fine = DistributedAgent(here, run_dir=tmp_path / "fine", **SMALL)
    finally:
        del gym.registry["HerePole-v0"]
    untrained = _params_of(fine)
    fine.train(1024, init_model_path=tmp_path / "pre", **train)
    assert started_from, "init_model_path loaded no weights"
    assert all(torch.equal(started_from[0][k], pretrained[k]) for k in pretrained)
    assert any(not torch.equal(a, b) for a, b in zip(untrained, pretrained.values(), strict=True))
    assert fine.algorithm is not None
    assert fine.algorithm.gradient_steps > 0
    assert fine.config.reward_signals is None


def _params_of(agent: DistributedAgent) -> list[torch.Tensor]:
    agent.eval(1)  # builds the untrained algorithm
    assert agent.algorithm is not None
    return [t.clone() for t in agent.algorithm.modules()["net"].state_dict().values()]


def test_train_holds_the_run_directorys_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/reliability.md: ``DistributedAgent.train`` holds its run directory's lock while
    it trains, and releases it when done."""
    import json
    import os

    from rlfleet.runs.run_dir import LOCK_FILE

    run_dir = tmp_path / "run"
    holders: list[int] = []
    step = DistributedTrainer._training_step

    def checking_step(self: DistributedTrainer) -> Any:
        holders.append(json.loads((run_dir / LOCK_FILE).read_text())["pid"])
        return step(self)

    monkeypatch.setattr(DistributedTrainer, "_training_step", checking_step)
    agent = DistributedAgent("CartPole-v1", run_dir=run_dir, **SMALL)
    agent.train(1024, eval_interval=1024, save_interval=1024, num_eval_episodes=1)
    assert holders
    assert set(holders) == {os.getpid()}
    assert not (run_dir / LOCK_FILE).exists()
