"""Actor-learner training on one local Ray cluster (shared by every test in this module)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlfleet.algos import get_algorithm
from rlfleet.checkpoint import CheckpointManager
from rlfleet.cli.main import main
from rlfleet.distributed import DistributedTrainer
from rlfleet.distributed.config import DistributedConfig
from rlfleet.envs.make import make_vec_env
from rlfleet.errors import ClusterError, ConfigError, EnvWorkerError
from rlfleet.logging.history import read_history
from rlfleet.runs.config import default_run_config
from rlfleet.runs.distributed_agent import DistributedAgent
from rlfleet.runs.run import make_trainer, train

pytestmark = pytest.mark.usefixtures("ray_cluster")

QUIET = {"show_progress": False, "verbose": False}
SMALL = {"num_actors": 2, "actor_num_cpus": 0.5}


def _column(run_dir: Path, name: str) -> np.ndarray:
    rows = read_history(run_dir / "history.parquet")
    return np.array([row[name] for row in rows if row.get(name) is not None])


def _config(algo: str, trainer: dict[str, Any], **overrides: Any) -> Any:
    """The preset with a small cluster; no target reward unless ``trainer`` sets one (a run
    that reached the preset's would stop before its budget)."""
    return default_run_config(
        algo,
        "CartPole-v1",
        {
            "env": {"num_test_envs": 4},
            "trainer": {**QUIET, "test_step_num_episodes": 4, "target_reward": None, **trainer},
            "distributed": {**SMALL, **overrides.pop("distributed", {})},
            **overrides,
        },
    )


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["impala", "appo"])
def test_learns_cartpole_within_budget(algo: str) -> None:
    """The preset solves CartPole-v1 (best test return >= 475) within 400k env steps.

    The actors' timing decides which policy copy collects each fragment, so no two runs share a
    trajectory, whatever the seed. Measured on 2 cores with one competing CPU-bound process,
    the current IMPALA preset reached the target in 7 of 8 runs within 200k steps (seeds 0-7,
    by 21k-123k steps; seed 6 ended at 444) and the APPO preset in each of 6 (seeds 0-5, by
    10k-61k steps); but in one CI run both IMPALA seeds missed at 200k (best 463 and 354), so
    each seed has 400k. An earlier IMPALA preset (fragments of 32 steps, 2 per update) missed
    it in 1 run of 22 at 400k. A second seed, tried only when the first misses, makes a
    spurious failure rare, while a learner that does not learn still fails both. A test step
    every 10k steps stops a run soon after it gets there: on a machine this busy the actors'
    round trips, not the arithmetic, set the pace (with two competing processes on 2 cores,
    20k-123k steps took 100-230 s).
    """
    results = []
    for seed in (0, 1):
        cfg = _config(
            algo,
            {
                "max_steps": 400_000,
                "epoch_num_steps": 10_240,
                "target_reward": 475,
                "test_step_num_episodes": 10,
            },
            seed=seed,
        )
        trainer = make_trainer(cfg, None)
        try:
            result = trainer.run()
        finally:
            trainer.close()
        results.append(result)
        if result.best_score >= 475:
            break
    assert results[-1].best_score >= 475, results


def test_killed_actor_is_replaced_and_training_goes_on(
    ray_cluster: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = _config("impala", {"max_steps": 12_288, "epoch_num_steps": 4096})
    killed: list[int] = []

    def kill_once(epoch: int, env_step: int) -> None:
        if env_step >= 4096 and not killed:
            ray_cluster.kill(trainer.actors.handles[0])
            killed.append(env_step)

    trainer = make_trainer(cfg, tmp_path, training_fn=kill_once)
    assert isinstance(trainer, DistributedTrainer)
    try:
        result = trainer.run()
    finally:
        trainer.close()
    assert killed
    assert result.env_steps >= 12_288
    assert result.stop_reason == "max_steps"
    assert "rollout actor 0 died" in caplog.text
    assert _column(tmp_path, "train/actor_restarts").max() == 1
    assert (_column(tmp_path, "train/policy_lag") >= 0).all()


def test_all_actors_dead_is_a_clear_error_and_the_checkpoint_survives(
    ray_cluster: Any, tmp_path: Path
) -> None:
    cfg = _config(
        "impala",
        {"max_steps": 40_960, "epoch_num_steps": 2048},
        distributed={"num_actors": 1, "max_actor_restarts": 0},
    )

    def kill_after_first_epoch(epoch: int, env_step: int) -> None:
        if epoch == 2:
            ray_cluster.kill(trainer.actors.handles[0])

    trainer = make_trainer(cfg, tmp_path, training_fn=kill_after_first_epoch)
    assert isinstance(trainer, DistributedTrainer)
    try:
        with pytest.raises(ClusterError, match="all 1 rollout actors died") as err:
            trainer.run()
    finally:
        trainer.close()
    assert "The latest checkpoint is intact" in str(err.value)
    state, meta = CheckpointManager(tmp_path / "checkpoints").load_latest()
    assert meta["counters"]["env_step"] == 2048
    assert state["distributed"]["policy_version"] == 2048 // (
        16 * 8
    )  # one 16 x 8 fragment per update


def test_resume_continues_counters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def config(max_steps: int) -> Any:
        return _config(
            "impala",
            {"max_steps": max_steps, "epoch_num_steps": 2048},
            distributed={"num_actors": 1},
            # a constant learning rate: a linear one would need schedule_on_resume to say
            # how the raised max_steps stretches it
            hyperparameters={"lr_schedule": "constant"},
        )

    # As if two actors had been restarted in an earlier session of this run.
    built = DistributedTrainer.__init__

    def restarted_twice(self: DistributedTrainer, *args: Any, **kwargs: Any) -> None:
        built(self, *args, **kwargs)
        self.restarts_before = 2

    with monkeypatch.context() as patch:
        patch.setattr(DistributedTrainer, "__init__", restarted_twice)
        first = train(config(4096), tmp_path)
    state, _ = CheckpointManager(tmp_path / "checkpoints").load_latest()
    per_update = 16 * 8  # the preset's one fragment of 16 steps x 8 envs
    assert state["distributed"]["policy_version"] == 4096 // per_update
    assert state["distributed"]["actor_restarts"] == 2
    first_rows = read_history(tmp_path / "history.parquet")
    resumed = train(config(8192), tmp_path, resume=True)
    assert resumed.env_steps == 8192
    assert resumed.epochs == first.epochs + 2
    assert resumed.gradient_steps == 8192 // per_update
    state, _ = CheckpointManager(tmp_path / "checkpoints").load_latest()
    assert state["distributed"]["policy_version"] == 8192 // per_update
    # The actor-restart count runs on too (docs/distributed.md: resume continues it).
    assert state["distributed"]["actor_restarts"] == 2
    assert set(_column(tmp_path, "train/actor_restarts")) == {2.0}
    # docs/distributed.md: resume continues the optimiser (Adam's step count runs on) and
    # the history (the first session's rows stay, the second's follow).
    adam_steps = {
        int(s["step"]) for s in state["algorithm"]["optimizers"]["optimizer"]["state"].values()
    }
    assert adam_steps == {8192 // per_update}
    rows = read_history(tmp_path / "history.parquet")
    assert rows[: len(first_rows)] == first_rows
    assert len(rows) > len(first_rows)
    # Logged as the mean over each log interval: it keeps rising past the first run's 32.
    versions = _column(tmp_path, "train/policy_version")
    assert np.all(np.diff(versions) > 0)
    assert versions[-1] > 4096 // per_update


def test_env_that_actors_cannot_create_reports_their_error(tmp_path: Path) -> None:
    # Registered in this process only: the driver's test envs build, the actors' do not.
    gym.register("DriverOnly-v0", entry_point="gymnasium.envs.classic_control:CartPoleEnv")
    try:
        agent = DistributedAgent(
            "DriverOnly-v0", eval_env="CartPole-v1", num_actors=1, run_dir=tmp_path / "run"
        )
        agent.config.distributed.actor_num_cpus = 0.5  # type: ignore[union-attr]
        with pytest.raises(EnvWorkerError, match="rollout actor 0 could not start") as err:
            agent.train(2048)
    finally:
        del gym.registry["DriverOnly-v0"]
    assert "EnvSpecError: unknown environment id 'DriverOnly-v0'" in str(err.value)


def test_agent_trains_evaluates_and_starts_from_a_model(tmp_path: Path) -> None:
    agent = DistributedAgent(
        "CartPole-v1", num_actors=1, num_steps=16, run_dir=tmp_path / "a", algo="appo"
    )
    agent.config.distributed.actor_num_cpus = 0.5  # type: ignore[union-attr]
    result = agent.train(
        4096, eval_interval=2048, save_interval=4096, num_eval_episodes=2, th_compile=True
    )
    assert result.env_steps == 4096
    assert "th_compile: true" in (tmp_path / "a" / "config.yaml").read_text()
    # One checkpoint: save_interval spans both epochs.
    assert len(list((tmp_path / "a" / "checkpoints").glob("step-*"))) == 1
    stats = agent.eval(3)
    assert stats.returns.size == 3
    # The run directory is every run's (docs/distributed.md): the CLI's eval, play, plot and
    # train --resume take it; the resumed run trains its raised budget.
    run = str(tmp_path / "a")
    assert main(["eval", run, "--episodes", "2"]) == 0
    assert main(["play", run, "--episodes", "1"]) == 0
    assert main(["plot", run, "--out", str(tmp_path / "a.png")]) == 0
    assert (tmp_path / "a.png").is_file()
    resume = ["--resume", run, "--schedule-on-resume", "stretch", "--max-steps", "6144"]
    assert main(["train", "appo", *resume, "--no-show-progress"]) == 0
    latest = CheckpointManager(tmp_path / "a" / "checkpoints", readonly=True).latest()
    assert latest is not None
    assert int(latest.name.removeprefix("step-")) >= 6144

    other = DistributedAgent(
        "CartPole-v1", num_actors=1, num_steps=16, run_dir=tmp_path / "b", algo="appo"
    )
    other.config.distributed.actor_num_cpus = 0.5  # type: ignore[union-attr]
    other.train(1024, init_model_path=tmp_path / "a", eval_interval=1024, num_eval_episodes=1)
    assert other.algorithm is not None
    assert other.algorithm.gradient_steps > 0


def test_cli_trains_with_four_actors(tmp_path: Path) -> None:
    code = main(
        [
            "train",
            "impala",
            "--env",
            "CartPole-v1",
            "--num-actors",
            "4",
            "--actor-num-cpus",
            "0.25",
            "--max-steps",
            "4096",
            "--epoch-num-steps",
            "4096",
            "--test-step-num-episodes",
            "2",
            "--no-show-progress",
            "--no-verbose",
            "--run-dir",
            str(tmp_path / "run"),
        ]
    )
    assert code == 0
    assert _column(tmp_path / "run", "env_step").max() == 4096


def _two_learner_update(
    ray: Any, name: str, config: Any = None
) -> tuple[Any, list[Any], list[Any]]:
    """An algorithm, two CartPole fragments of 32 steps x 4 envs it collected, and the states
    of two learners after one update from its state on them (one fragment each)."""
    from rlfleet.algos import get_algorithm
    from rlfleet.collect.collector import Collector
    from rlfleet.data.rollout import RolloutStorage
    from rlfleet.distributed.learner import LearnerGroup, LearnerSpec
    from rlfleet.envs.make import make_vec_env

    envs = make_vec_env("CartPole-v1", 4, seed=0)
    obs_space, action_space = envs.single_observation_space, envs.single_action_space
    algo = get_algorithm(name)(obs_space, action_space, config, seed=0)
    collector = Collector(envs, algo, seed=0)
    fragments = []
    for _ in range(2):
        storage = RolloutStorage.for_spaces(32, 4, obs_space, action_space)
        collector.collect_rollout(storage)
        fragments.append(storage)
    spec = LearnerSpec(name, algo.config, obs_space, action_space, 0, "cpu", False)
    group = LearnerGroup(ray, spec, num_learners=2, num_cpus=0.5, num_gpus=0)
    try:
        group.load_state(algo.state_dict())
        group.update(1, 0.0, [ray.put(f) for f in fragments])
        states = [ray.get(h.state.remote()) for h in group.handles]
    finally:
        group.shutdown()
    return algo, fragments, states


def test_two_learners_average_gradients(ray_cluster: Any) -> None:
    from rlfleet.algos import IMPALA
    from rlfleet.algos.policy_gradient import LearnerBatch

    algo, fragments, states = _two_learner_update(ray_cluster, "impala")

    # By hand: each learner's gradient on its own fragment, averaged, clipped, one Adam step.
    grads = []
    for fragment in fragments:
        copy = IMPALA(algo.observation_space, algo.action_space, seed=0)
        copy.load_state_dict(algo.state_dict())
        loss = copy._compute_loss(LearnerBatch.of(fragment, copy.device))[0]
        loss.backward()
        grads.append([p.grad for p in copy.net.parameters()])
    for param, g0, g1 in zip(algo.net.parameters(), *grads, strict=True):
        param.grad = (g0 + g1) / 2
    torch.nn.utils.clip_grad_norm_(algo.net.parameters(), algo.config.max_grad_norm)
    algo.optimizer.step()

    for state in states:
        for key, expected in algo.net.state_dict().items():
            torch.testing.assert_close(state["modules"]["net"][key], expected)


def test_two_appo_learners_stay_identical_over_epochs_of_minibatches(ray_cluster: Any) -> None:
    # Eight backward passes per update (4 minibatches x 2 epochs), each all-reduced.
    from rlfleet.algos.appo import APPOConfig

    config = APPOConfig(num_steps=32, batch_size=32, num_epochs=2)
    algo, _, states = _two_learner_update(ray_cluster, "appo", config)
    first, second = (state["modules"]["net"] for state in states)
    assert all(torch.equal(first[key], second[key]) for key in first)
    assert any(not torch.equal(first[key], value) for key, value in algo.net.state_dict().items())


def test_run_with_two_learners_checkpoints_learner_zero(
    ray_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlfleet.distributed.learner import LearnerGroup, LearnerSpec

    specs: list[LearnerSpec] = []
    start = LearnerGroup.__init__

    def recording_start(group: LearnerGroup, ray: Any, spec: LearnerSpec, **options: Any) -> None:
        specs.append(spec)
        start(group, ray, spec, **options)

    monkeypatch.setattr(LearnerGroup, "__init__", recording_start)
    cfg = _config(
        "impala",
        {"max_steps": 2048, "epoch_num_steps": 1024, "nan_policy": "skip_batch"},
        hyperparameters={"num_steps": 16, "batch_fragments": 1},
        distributed={"num_actors": 1, "num_learners": 2, "learner_num_cpus": 0.25},
    )
    trainer = make_trainer(cfg, tmp_path)
    assert isinstance(trainer, DistributedTrainer)
    # Every learner follows the trainer's nan_policy.
    assert [spec.nan_policy for spec in specs] == ["skip_batch"]
    try:
        result = trainer.run()
        assert trainer.learners is not None
        learner_states = [ray_cluster.get(h.state.remote()) for h in trainer.learners.handles]
    finally:
        trainer.close()
    # Two learners x one fragment of 16 steps x 8 envs per update.
    assert result.gradient_steps == 2048 // 256
    state, _ = CheckpointManager(tmp_path / "checkpoints").load_latest()
    assert state["algorithm"]["gradient_steps"] == result.gradient_steps
    for learner_state in learner_states:
        for key, value in learner_state["modules"]["net"].items():
            torch.testing.assert_close(state["algorithm"]["modules"]["net"][key], value)


def test_two_learners_fold_every_learners_observations_into_equal_statistics(
    ray_cluster: Any,
) -> None:
    from rlfleet.algos import IMPALA
    from rlfleet.algos.impala import IMPALAConfig
    from rlfleet.collect.collector import Collector
    from rlfleet.distributed.actors import fragment_storage
    from rlfleet.distributed.learner import LearnerGroup, LearnerSpec
    from rlfleet.envs.make import make_vec_env
    from rlfleet.nn.normalize import RunningNormalizer

    envs = make_vec_env("CartPole-v1", 4, seed=0)
    config = IMPALAConfig(num_steps=16, normalize_obs=True)
    algo = IMPALA(envs.single_observation_space, envs.single_action_space, config, seed=0)
    collector = Collector(envs, algo, seed=0)
    fragments = []
    for _ in range(2):
        storage = fragment_storage(algo, 16, 4)
        collector.collect_rollout(storage)
        fragments.append(storage)
    envs.close()
    spec = LearnerSpec("impala", config, algo.observation_space, algo.action_space, 0, "cpu", False)
    group = LearnerGroup(ray_cluster, spec, num_learners=2, num_cpus=0.5, num_gpus=0)
    try:
        group.load_state(algo.state_dict())
        _, _, weights_ref = group.update(1, 0.0, [ray_cluster.put(f) for f in fragments])
        states = [ray_cluster.get(h.state.remote()) for h in group.handles]
        shipped = ray_cluster.get(weights_ref)
    finally:
        group.shutdown()
    expected = RunningNormalizer((4,))
    expected.update(torch.cat([f.obs.reshape(-1, 4) for f in fragments]))
    for stats in [state["modules"]["obs_normalizer"] for state in states] + [
        shipped.modules["obs_normalizer"]
    ]:
        for name in ("mean", "var", "count"):
            torch.testing.assert_close(stats[name], getattr(expected, name))


@pytest.mark.parametrize(
    "trainer", [{"compile": True}, {"cuda_graphs": True}, {"precision": "bf16"}]
)
def test_compile_and_precision_are_refused_before_any_actor_starts(
    trainer: dict[str, Any],
) -> None:
    cfg = default_run_config("impala", "CartPole-v1", {"trainer": trainer})
    with pytest.raises(
        ConfigError, match=r"do not apply to actor-learner runs .*distributed.th_compile"
    ):
        make_trainer(cfg, None)


def test_auto_threads_leave_the_actors_their_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("rlfleet.distributed.trainer.available_cores", lambda: 8)
    trainer = make_trainer(
        _config("impala", {"max_steps": 256}, distributed={"num_actors": 3}), None
    )
    try:
        assert isinstance(trainer, DistributedTrainer)
        assert trainer.cores_for_learning() == 8 - 2  # three actors at half a CPU each
    finally:
        trainer.close()


@pytest.mark.parametrize("requests", [1, 2])
def test_no_actor_has_more_than_requests_per_actor_requests_in_flight(
    requests: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/distributed.md: each actor has at most ``requests_per_actor`` (1 or 2) requests
    in flight; the bound is reached, so it is the bound that holds them back."""
    from collections import Counter

    from rlfleet.distributed.actors import RolloutActors

    most: list[int] = []
    submit = RolloutActors._submit

    def counting_submit(self: RolloutActors, held: int) -> None:
        submit(self, held)
        owners = Counter(actor for actor, _ in self.pending.values())
        most.append(max(owners.values(), default=0))

    monkeypatch.setattr(RolloutActors, "_submit", counting_submit)
    cfg = _config(
        "impala",
        {"max_steps": 4096, "epoch_num_steps": 4096},
        distributed={"num_actors": 2, "requests_per_actor": requests},
    )
    train(cfg)
    assert most
    assert max(most) == requests


def test_a_bad_distributed_config_given_to_the_trainer_is_refused_at_construction() -> None:
    # docs/reliability.md: "a DistributedConfig given to DistributedTrainer" is checked as the
    # config files are: a one-line ConfigError naming the field.
    envs = make_vec_env("CartPole-v1", 1)
    try:
        algo = get_algorithm("impala")(envs.single_observation_space, envs.single_action_space)
        with pytest.raises(ConfigError) as err:
            DistributedTrainer(
                algo,
                envs,
                env_id="CartPole-v1",
                num_envs=2,
                distributed=DistributedConfig(num_actors=0),
            )
    finally:
        envs.close()
    assert str(err.value) == (
        "DistributedConfig.num_actors: input should be greater than 0 (got 0)"
    )
