"""IMPALA's update: deterministic, blind to reset steps, and off-policy corrected; its
learner-owned observation statistics, CNN encoders and recurrent policy; and a learning test
with lagging in-process actors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import rlfleet
from rlfleet.algos import IMPALA
from rlfleet.algos.impala import IMPALAConfig
from rlfleet.algos.registry import get_algorithm
from rlfleet.collect.collector import Collector
from rlfleet.data.rollout import RolloutStorage
from rlfleet.distributed.actors import (
    RolloutWorker,
    WorkerSpec,
    fragment_storage,
    policy_weights,
)
from rlfleet.envs.make import make_vec_env
from rlfleet.errors import ConfigError
from rlfleet.nn.encoders import ImageEncoder
from rlfleet.runs.config import default_run_config
from tests.nan_injection import nan_outputs
from tests.toy_envs import BrightSide


def _batch(seed: int = 0) -> tuple[RolloutStorage, IMPALA]:
    envs = make_vec_env("CartPole-v1", 4, seed=seed)
    algo = IMPALA(envs.single_observation_space, envs.single_action_space, seed=seed)
    storage = RolloutStorage.for_spaces(
        64, 4, envs.single_observation_space, envs.single_action_space
    )
    Collector(envs, algo, seed=seed).collect_rollout(storage)
    envs.close()
    return storage, algo


def _updated(batch: RolloutStorage, seed: int) -> IMPALA:
    algo = IMPALA(*_spaces(), seed=seed)
    algo.update(batch)
    return algo


def _spaces() -> tuple[Any, Any]:
    envs = make_vec_env("CartPole-v1", 1)
    found = (envs.single_observation_space, envs.single_action_space)
    envs.close()
    return found


def test_same_seed_and_batch_give_identical_parameters() -> None:
    batch, _ = _batch()
    first, second, other = _updated(batch, 3), _updated(batch, 3), _updated(batch, 4)
    assert torch.equal(first.parameters_vector(), second.parameters_vector())
    assert not torch.equal(first.parameters_vector(), other.parameters_vector())
    assert first.gradient_steps == 1


def test_reset_steps_do_not_change_the_update() -> None:
    batch, _ = _batch()
    invalid = batch.valid == 0
    assert invalid.any(), "the batch should contain episode ends"
    changed = RolloutStorage.for_spaces(64, 4, *_spaces())
    changed.copy_envs_from(batch, 0)
    changed.rewards[invalid] = 100.0
    changed.actions[invalid] = 1 - changed.actions[invalid]
    changed.log_probs[invalid] = -5.0
    a, b = _updated(batch, 0), _updated(changed, 0)
    torch.testing.assert_close(a.parameters_vector(), b.parameters_vector())


def test_stale_behaviour_policy_lowers_the_importance_weight() -> None:
    batch, _ = _batch()
    metrics = _updated(batch, 0).update(batch)
    assert metrics["train/mean_rho"] <= 1.0
    # Behaviour log-probs far above the learner's: pi/mu is tiny and so is the mean rho.
    batch.log_probs.fill_(0.0)
    assert _updated(batch, 0).update(batch)["train/mean_rho"] < 0.9


def test_epochs_are_successive_steps_that_each_re_evaluate_the_batch() -> None:
    batch, _ = _batch()
    several = IMPALA(*_spaces(), IMPALAConfig(num_epochs=3), seed=0)
    metrics = several.update(batch)
    assert several.gradient_steps == 3
    one_at_a_time = IMPALA(*_spaces(), seed=0)
    first = one_at_a_time.update(batch)
    for _ in range(2):
        one_at_a_time.update(batch)
    assert torch.equal(several.parameters_vector(), one_at_a_time.parameters_vector())
    # The batch was collected by these very weights, so the first step's importance weights
    # are 1; the later steps re-evaluate them with the moved weights, which lowers the mean.
    assert first["train/mean_rho"] == pytest.approx(1.0)
    assert metrics["train/mean_rho"] < first["train/mean_rho"] - 1e-4


def test_skipped_steps_leave_the_weights_and_every_epoch_is_tried() -> None:
    # Every epoch still runs: with several learners each must join every gradient all-reduce.
    batch, _ = _batch()
    algo = IMPALA(*_spaces(), IMPALAConfig(num_epochs=3), seed=0)
    algo.nan_policy = "skip_batch"
    params = algo.parameters_vector().clone()
    nan_outputs(algo.modules().values())
    assert algo.update(batch) == {"train/learning_rate": pytest.approx(1e-3)}
    assert algo.skipped_batches == 3
    assert algo.gradient_steps == 0
    assert torch.equal(algo.parameters_vector(), params)


# ------------------------------------------------------------ normalisation, CNN, LSTM


def _cartpole(config: IMPALAConfig, seed: int = 0) -> tuple[Any, IMPALA]:
    envs = make_vec_env("CartPole-v1", 4, seed=seed)

    return envs, IMPALA(envs.single_observation_space, envs.single_action_space, config, seed=seed)


def test_observation_statistics_change_only_in_the_learners_update() -> None:
    envs, algo = _cartpole(IMPALAConfig(num_steps=16, normalize_obs=True))
    assert algo.obs_stats.normalizer is not None
    assert "obs_normalizer" in algo.modules()
    storage = fragment_storage(algo, 16, 4)
    Collector(envs, algo, seed=0).collect_rollout(storage)
    envs.close()
    # Acting (what an actor does) leaves the statistics alone and stores raw observations.
    assert float(algo.obs_stats.normalizer.count) == pytest.approx(1e-4)
    raw = storage.obs.reshape(-1, 4)
    assert torch.equal(algo.preprocess(raw.numpy()), raw)
    assert raw.abs().max() > 0.0
    algo.update(storage)
    assert float(algo.obs_stats.normalizer.count) == pytest.approx(64 + 1e-4)
    torch.testing.assert_close(
        algo.obs_stats.normalizer.mean.float(), raw.mean(0), rtol=1e-4, atol=1e-4
    )
    # act() normalises with the statistics as they are, without changing them
    before = algo.obs_stats.normalizer.count.clone()
    acted = algo.act(raw, deterministic=True)
    direct = algo.net.act(algo.obs_stats.normalizer(raw), algo.generator, deterministic=True)
    assert torch.equal(acted.values, direct.values)
    assert torch.equal(algo.obs_stats.normalizer.count, before)


def test_image_observations_refuse_normalize_obs() -> None:
    space = spaces.Box(0, 255, (36, 36, 1), np.uint8)
    with pytest.raises(ConfigError, match="normalize_obs applies to vector observations"):
        IMPALA(space, spaces.Discrete(2), IMPALAConfig(normalize_obs=True))


@pytest.mark.parametrize("cnn", ["nature", "impala"])
def test_cnn_impala_acts_on_images_and_learns_from_them(cnn: str) -> None:
    envs = SyncVectorEnv([BrightSide] * 4, autoreset_mode=AutoresetMode.NEXT_STEP)
    config = IMPALAConfig(num_steps=8, cnn=cnn)  # type: ignore[arg-type]
    algo = IMPALA(envs.single_observation_space, envs.single_action_space, config, seed=0)
    assert isinstance(algo.net.encoder, ImageEncoder)
    storage = fragment_storage(algo, 8, 4)
    assert storage.obs.dtype == torch.uint8  # fragments carry the images as bytes
    Collector(envs, algo, seed=0).collect_rollout(storage)
    envs.close()
    assert storage.obs.shape == (8, 4, 36, 36, 1)
    assert set(storage.actions.unique().tolist()) <= {0, 1}
    before = algo.parameters_vector()
    metrics = algo.update(storage)
    assert np.isfinite(metrics["loss/policy"])
    assert not torch.equal(before, algo.parameters_vector())


OPTIONS: dict[str, dict[str, Any]] = {
    "normalize_obs": {"normalize_obs": True},
    "lstm": {"lstm_hidden_size": 16, "sequence_length": 8},
    "cnn": {"cnn": "impala"},
}


@pytest.mark.parametrize("algo_name", ["impala", "appo"])
@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_save_and_load_give_identical_actions(algo_name: str, option: str, tmp_path: Path) -> None:
    cls = get_algorithm(algo_name)
    config = cls.config_class(num_steps=16, batch_size=64, **OPTIONS[option])
    if algo_name == "impala":
        config.batch_size = None
    if option == "cnn":
        envs = SyncVectorEnv([BrightSide] * 4, autoreset_mode=AutoresetMode.NEXT_STEP)
    else:
        envs = make_vec_env("CartPole-v1", 4, seed=0)
    algo = cls(envs.single_observation_space, envs.single_action_space, config, seed=0)
    storage = fragment_storage(algo, 16, 4)
    Collector(envs, algo, seed=0).collect_rollout(storage)
    algo.update(storage)  # statistics and weights away from their initial values
    obs, _ = envs.reset(seed=5)
    envs.close()
    loaded = rlfleet.load(algo.save(tmp_path / "saved"))
    assert type(loaded) is cls
    assert loaded.modules().keys() == algo.modules().keys()
    np.testing.assert_array_equal(loaded.predict(obs), algo.predict(obs))
    ours = algo.act(algo.preprocess(obs), deterministic=True, **_state(algo))
    theirs = loaded.act(loaded.preprocess(obs), deterministic=True, **_state(loaded))
    assert torch.equal(ours.values, theirs.values)
    if option == "normalize_obs":
        assert torch.equal(loaded.obs_stats.normalizer.mean, algo.obs_stats.normalizer.mean)
        assert float(loaded.obs_stats.normalizer.count) > 1.0


def _state(algo: Any) -> dict[str, torch.Tensor]:
    state = algo.initial_state(4)
    return {} if state is None else {"state": state}


def _greedy_return(algo: IMPALA, episodes: int = 10, seed: int = 100) -> float:
    """Mean return of ``episodes`` greedy CartPole-v1 episodes."""
    envs = make_vec_env("CartPole-v1", episodes, seed=seed)
    obs, _ = envs.reset(seed=seed)
    totals, done = np.zeros(episodes), np.zeros(episodes, dtype=bool)
    while not done.all():
        obs, rewards, terminated, truncated, _ = envs.step(algo.predict(obs))
        totals += rewards * ~done
        done |= terminated | truncated
    envs.close()
    return float(totals.mean())


@pytest.mark.slow
def test_learns_cartpole_from_two_lagging_in_process_actors() -> None:
    """The shipped CartPole-v1 preset, with two rollout workers run in this process taking
    turns, each collecting with the weights of one update before the latest (the policy lag
    V-trace corrects), which travel as :class:`PolicyWeights`.

    A random policy scores about 22. Greedy returns (10 episodes) of this seed were 176, 257
    and 272 at 10k, 20k and 30k env steps under each of the three numerics settings (they part
    after that, as training on a moving batch does); the bar of 200 within 60k steps leaves
    room for other machines.
    """
    run = default_run_config("impala", "CartPole-v1")
    config = run.hyperparameters
    assert isinstance(config, IMPALAConfig)
    spec = WorkerSpec("CartPole-v1", run.env.num_envs, "sync", {}, "impala", config, seed=0)
    workers = [RolloutWorker(0, spec), RolloutWorker(1, spec)]
    obs_space, action_space = workers[0].start()
    workers[1].start()
    learner = IMPALA(obs_space, action_space, config, seed=0)
    batch = fragment_storage(learner, config.num_steps, run.env.num_envs)
    latest = lagging = policy_weights(learner, 0)
    steps, returns = 0, [0.0]
    budget, test_every = 60_000, 10_240
    while steps < budget and max(returns) < 200:
        info, fragment = workers[learner.gradient_steps % 2].collect(lagging)
        assert info.policy_version == max(learner.gradient_steps - 1, 0)
        batch.copy_envs_from(fragment, 0)
        steps += info.stats.env_steps
        learner.set_progress(steps / budget)
        learner.update(batch)
        lagging, latest = latest, policy_weights(learner, learner.gradient_steps)
        if steps % test_every == 0:
            returns.append(_greedy_return(learner))
    assert max(returns) >= 200, (steps, returns)


@pytest.mark.parametrize("algo_name", ["impala", "appo"])
def test_the_learner_unrolls_the_actors_log_probabilities_and_values_step_for_step(
    algo_name: str,
) -> None:
    """docs/distributed.md: with the actor's weights, the learner's unroll of a recurrent
    fragment (sequences of 8 steps, each from the state stored at its first step, with the
    same resets) reproduces the actor's log-probabilities and values at every step."""
    from rlfleet.algos.policy_gradient import LearnerBatch, recurrent_rollout

    cls = get_algorithm(algo_name)
    config = cls.config_class(num_steps=32, lstm_hidden_size=8, sequence_length=8)
    if algo_name == "appo":
        config.batch_size = 32
    envs = make_vec_env("CartPole-v1", 4, seed=0)
    algo = cls(envs.single_observation_space, envs.single_action_space, config, seed=0)
    storage = fragment_storage(algo, 32, 4)
    Collector(envs, algo, seed=0).collect_rollout(storage)
    envs.close()
    batch = LearnerBatch.of(storage, algo.device)
    assert batch.starts is not None
    assert int(batch.starts[1:].sum()) > 0  # episodes began inside the fragment
    with torch.no_grad():
        log_probs, _, values, _ = recurrent_rollout(algo.net, batch, 8)
    torch.testing.assert_close(log_probs, storage.log_probs, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(values, storage.values, rtol=1e-5, atol=1e-6)
