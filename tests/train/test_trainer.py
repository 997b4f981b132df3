"""The trainer loop: hooks, stop rules, resume."""

from __future__ import annotations

import inspect
import itertools
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rlfleet.algos.dqn import DQN, DQNConfig
from rlfleet.algos.ppo import PPO, PPOConfig
from rlfleet.checkpoint import CheckpointManager
from rlfleet.envs.make import make_vec_env
from rlfleet.errors import ConfigError, RunDirError
from rlfleet.logging.history import read_history
from rlfleet.nn import precision
from rlfleet.nn.compile import CACHE_ENV, COMPILE_SUBDIR, INDUCTOR_CACHE_ENV, compile_cache_dir
from rlfleet.runs.config import default_run_config
from rlfleet.runs.run import make_trainer, train
from rlfleet.train import trainer as trainer_module
from rlfleet.train.loop import TrainerConfig
from rlfleet.train.trainer import OffPolicyTrainer, OnPolicyTrainer, Trainer
from rlfleet.types import EvalStats


def _cfg(**trainer: Any) -> Any:
    return default_run_config(
        "ppo",
        "CartPole-v1",
        {
            "env": {"num_envs": 4, "num_test_envs": 2},
            "hyperparameters": {"num_steps": 32, "num_epochs": 2, "batch_size": 64},
            "trainer": {
                "show_progress": False,
                "verbose": False,
                "target_reward": None,
                "test_step_num_episodes": 2,
                "log_interval_steps": 128,
                **trainer,
            },
        },
    )


def test_hooks_are_called_with_documented_arguments(tmp_path: Path) -> None:
    calls: dict[str, list[Any]] = {"train": [], "test": [], "stop": [], "score": [], "best": []}
    saved: list[tuple[int, int, int]] = []

    def save_checkpoint_fn(epoch: int, env_step: int, gradient_step: int) -> str:
        saved.append((epoch, env_step, gradient_step))
        return "somewhere"

    def compute_score_fn(stats: EvalStats) -> float:
        calls["score"].append(stats.returns.size)
        return -float(stats.mean)  # a score that differs from the mean return

    trainer = make_trainer(
        _cfg(max_steps=1024, epoch_num_steps=256, test_in_training=False),
        tmp_path,
        training_fn=lambda epoch, step: calls["train"].append((epoch, step)),
        test_fn=lambda epoch, step: calls["test"].append((epoch, step)),
        stop_fn=lambda score: calls["stop"].append(score) or False,
        compute_score_fn=compute_score_fn,
        save_best_fn=lambda algo: calls["best"].append(algo.name),
        save_checkpoint_fn=save_checkpoint_fn,
    )
    result = trainer.run()
    assert result.epochs == 4
    assert calls["train"][:3] == [(1, 0), (1, 128), (2, 256)]
    assert calls["test"] == [(1, 256), (2, 512), (3, 768), (4, 1024)]
    assert calls["score"] == [2, 2, 2, 2]
    assert calls["stop"]
    assert all(s <= 0 for s in calls["stop"])
    assert calls["best"][0] == "ppo"
    assert [s[:2] for s in saved] == [(1, 256), (2, 512), (3, 768), (4, 1024)]
    assert result.best_score == max(calls["stop"])


def test_stop_fn_ends_training_and_target_reward_is_the_default_stop_rule() -> None:
    trainer = make_trainer(_cfg(max_steps=10_000, epoch_num_steps=256, target_reward=-1.0), None)
    result = trainer.run()
    assert result.stop_reason.startswith("stop_fn")
    assert result.env_steps == 256


def test_early_stop_and_plateau_rules() -> None:
    # A score that never improves: every test step after the first counts as a plateau.
    trainer = make_trainer(
        _cfg(
            max_steps=100_000,
            epoch_num_steps=128,
            early_stop_patience=3,
            plateau_reduce_patience=1,
            plateau_reduce_factor=0.5,
        ),
        None,
        compute_score_fn=lambda stats: 0.0,
    )
    result = trainer.run()
    assert result.stop_reason == "early_stop_patience"
    assert result.epochs == 4
    assert trainer.algorithm.lr_scale == pytest.approx(0.5**2)


def test_resume_continues_counters_optimizer_and_history(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = train(_cfg(max_steps=512, epoch_num_steps=256), run_dir)
    rows_before = read_history(run_dir / "history.parquet")
    state, _ = CheckpointManager(run_dir / "checkpoints").load_latest()
    saved_params = state["algorithm"]["modules"]["net"]

    trainer = make_trainer(_cfg(max_steps=1024, epoch_num_steps=256), run_dir, resume=True)
    assert trainer.counters.env_step == first.env_steps == 512
    assert trainer.algorithm.gradient_steps == first.gradient_steps
    for key, value in trainer.algorithm.net.state_dict().items():
        assert torch.equal(value, saved_params[key])
    assert trainer.algorithm.optimizer.state_dict()["state"][0]["step"] > 0
    result = trainer.run()
    assert result.env_steps == 1024
    assert result.epochs == 4
    rows_after = read_history(run_dir / "history.parquet")
    assert rows_after[: len(rows_before)] == rows_before
    steps = [row["env_step"] for row in rows_after]
    assert steps == sorted(steps)
    assert steps[-1] == 1024


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"max_steps": 0}, r"^TrainerConfig\.max_steps: input should be greater than 0 \(got 0\)$"),
        ({"target_reward": float("nan")}, r"^TrainerConfig\.target_reward: expected a number"),
        ({"test_time_share": 1.5}, r"^TrainerConfig\.test_time_share: .*\(got 1\.5\)$"),
    ],
)
def test_a_trainer_config_built_in_python_is_checked_as_a_run_config_is(
    settings: dict[str, Any], message: str
) -> None:
    algo = PPO(*_spaces(), PPOConfig(num_steps=8, batch_size=16))
    envs = make_vec_env("CartPole-v1", 2, seed=0)
    try:
        with pytest.raises(ConfigError, match=message):
            OnPolicyTrainer(algo, envs, None, TrainerConfig(**settings))
    finally:
        envs.close()


def _spaces() -> tuple[Any, Any]:
    envs = make_vec_env("CartPole-v1", 1, seed=0)
    spaces = envs.single_observation_space, envs.single_action_space
    envs.close()
    return spaces


def test_existing_run_dir_needs_resume_or_force(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    train(_cfg(max_steps=128, epoch_num_steps=128), run_dir)
    marker = run_dir / "history.parquet"
    before = marker.read_bytes()
    # Python callers are told the parameters; the CLI names its flags (test_from_options).
    with pytest.raises(RunDirError, match=r"pass resume=True to continue it or force=True"):
        train(_cfg(max_steps=128, epoch_num_steps=128), run_dir)
    assert marker.read_bytes() == before
    train(_cfg(max_steps=128, epoch_num_steps=128), run_dir, force=True)
    assert (run_dir / "config.yaml").is_file()


def test_force_refuses_a_directory_that_is_not_a_run(tmp_path: Path) -> None:
    precious = tmp_path / "thesis"
    precious.mkdir()
    (precious / "chapter1.tex").write_text("do not delete")
    with pytest.raises(RunDirError, match="does not look like a run directory"):
        train(_cfg(max_steps=128, epoch_num_steps=128), precious, force=True)
    assert (precious / "chapter1.tex").read_text() == "do not delete"


def test_test_time_is_counted_once(tmp_path: Path) -> None:
    # Benchmarks subtract TrainResult.test_time_s from wall time: counting a test step
    # twice would make training look faster than it is.
    trainer = make_trainer(
        _cfg(max_steps=512, epoch_num_steps=128, test_in_training=False), tmp_path
    )
    evaluate = trainer.evaluator.run
    spans: list[float] = []

    def timed_run(num_episodes: int, **kwargs: Any) -> EvalStats:
        t0 = time.perf_counter()
        stats = evaluate(num_episodes, **kwargs)
        spans.append(time.perf_counter() - t0)
        return stats

    trainer.evaluator.run = timed_run  # type: ignore[method-assign]
    result = trainer.run()
    rows = read_history(tmp_path / "history.parquet")
    logged = [r["time/test_s"] for r in rows if r.get("time/test_s") is not None]
    assert len(spans) == len(logged) == result.epochs == 4
    assert result.test_time_s == pytest.approx(sum(logged))
    # The logged span holds the evaluation itself plus a little bookkeeping around it.
    assert sum(spans) <= result.test_time_s < sum(spans) + 0.5
    assert result.test_time_s < result.wall_time_s


def test_every_hook_is_documented_in_the_user_guide_and_the_module_docstring() -> None:
    hooks = [p for p in inspect.signature(Trainer.__init__).parameters if p.endswith("_fn")]
    guide = (Path(__file__).resolve().parents[2] / "docs" / "user-guide.md").read_text()
    assert len(hooks) >= 7
    for hook in hooks:
        assert f"| `{hook}` | `(" in guide, hook
        assert f"``{hook}(" in trainer_module.__doc__, hook


@pytest.mark.parametrize(("batch_size", "gradient_steps"), [(None, 1), (128, 4), ("unset", 2)])
def test_batch_size_none_takes_the_whole_rollout_as_one_minibatch(
    batch_size: Any, gradient_steps: int
) -> None:
    envs = make_vec_env("CartPole-v1", 2, seed=0)
    algo = PPO(
        envs.single_observation_space,
        envs.single_action_space,
        PPOConfig(num_steps=256, batch_size=256, num_epochs=1),
        seed=0,
    )
    given = {} if batch_size == "unset" else {"batch_size": batch_size}
    trainer = OnPolicyTrainer(
        algo,
        envs,
        None,
        TrainerConfig(max_steps=512, epoch_num_steps=512, show_progress=False, verbose=False),
        update_step_num_repetitions=1,
        **given,
    )
    trainer.run()
    # A 512-step rollout, one repetition: one gradient step for the whole buffer, else
    # rollout / batch_size (the algorithm's own batch_size when none is given).
    assert algo.gradient_steps == gradient_steps


# ------------------------------------------------ every Tianshou 2 parameter and hook


class _Recorder:
    """Records each hook's and logger method's arguments, and the counters at the call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.trainer: Trainer | None = None

    def hook(self, name: str, result: Any = None) -> Any:
        def record(*args: Any) -> Any:
            self.calls.append((name, args))
            return result(*args) if callable(result) else result

        return record

    def of(self, name: str) -> list[tuple[Any, ...]]:
        return [args for n, args in self.calls if n == name]

    # Tianshou's logger methods
    def log_train_data(self, log_data: dict[str, Any], step: int) -> None:
        self.calls.append(("log_train_data", (log_data, step)))

    def log_test_data(self, log_data: dict[str, Any], step: int) -> None:
        self.calls.append(("log_test_data", (log_data, step)))

    def log_update_data(self, log_data: dict[str, Any], step: int) -> None:
        self.calls.append(("log_update_data", (log_data, step)))

    def save_data(
        self, epoch: int, env_step: int, gradient_step: int, save_checkpoint_fn: Any = None
    ) -> None:
        path = save_checkpoint_fn(epoch, env_step, gradient_step)
        self.calls.append(("save_data", (epoch, env_step, gradient_step, path)))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@pytest.mark.parametrize("kind", ["on_policy", "off_policy"])
def test_every_tianshou_parameter_and_hook_is_taken_and_called_as_documented(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rec = _Recorder()
    max_epochs, epoch_num_steps, test_episodes = 3, 256, 3
    config = TrainerConfig(
        max_steps=100_000,
        max_epochs=max_epochs,
        epoch_num_steps=epoch_num_steps,
        test_step_num_episodes=test_episodes,
        test_in_training=True,
        log_interval_steps=64,
        verbose=False,
        show_progress=False,
    )
    train_envs = make_vec_env("CartPole-v1", 2, seed=0)
    test_envs = make_vec_env("CartPole-v1", 2)
    spaces = (train_envs.single_observation_space, train_envs.single_action_space)
    hooks: dict[str, Any] = {
        "training_fn": rec.hook("training_fn"),
        "test_fn": rec.hook("test_fn"),
        # Never satisfied, so every epoch runs; called with test and training scores.
        "stop_fn": rec.hook("stop_fn", False),
        "compute_score_fn": rec.hook("compute_score_fn", lambda stats: float(stats.mean) - 1),
        "save_best_fn": rec.hook("save_best_fn"),
        "save_checkpoint_fn": rec.hook(
            "save_checkpoint_fn", lambda e, s, g: str(tmp_path / f"ckpt-{e}-{s}-{g}")
        ),
        "multi_agent_return_reduction": rec.hook(
            "multi_agent_return_reduction", lambda returns: returns * 2.0
        ),
        "logger": rec,
        "resume_from_log": False,
    }
    trainer: Trainer
    if kind == "on_policy":
        algo = PPO(*spaces, PPOConfig(num_steps=32), seed=0)
        trainer = OnPolicyTrainer(
            algo, train_envs, test_envs, config, seed=0,
            collection_step_num_env_steps=64, batch_size=32, update_step_num_repetitions=3,
            **hooks,
        )  # fmt: skip
        # 64 steps in minibatches of 32, 3 repetitions: 6 gradient steps per training step.
        expected_gradient_steps = lambda env_steps: env_steps // 64 * 6  # noqa: E731
    else:
        algo = DQN(*spaces, DQNConfig(learning_starts=0, buffer_size=2000), seed=0)
        trainer = OffPolicyTrainer(
            algo, train_envs, test_envs, config, seed=0,
            collection_step_num_episodes=2, batch_size=16,
            update_step_num_gradient_steps_per_sample=0.5,
            **hooks,
        )  # fmt: skip
        expected_gradient_steps = lambda env_steps: env_steps // 2  # noqa: E731
    result = trainer.run(reset_collectors=True, reset_collector_buffers=False)
    assert capsys.readouterr().out == ""  # verbose=False, show_progress=False
    assert result.stop_reason == "max_epochs"
    assert result.epochs == max_epochs
    assert result.gradient_steps == expected_gradient_steps(result.env_steps)

    # training_fn(epoch, env_step): before every training step, with the counters then.
    training = rec.of("training_fn")
    assert all(len(a) == 2 and _is_int(a[0]) and _is_int(a[1]) for a in training)
    assert training[0] == (1, 0)
    assert [e for e, _ in training] == sorted(e for e, _ in training)
    assert {e for e, _ in training} == set(range(1, max_epochs + 1))
    steps = [s for _, s in training]
    assert steps == sorted(steps)
    assert len(set(steps)) == len(steps)

    # test_fn(epoch, env_step): before every test step, one at the end of each epoch.
    tests = rec.of("test_fn")
    assert [e for e, _ in tests] == list(range(1, max_epochs + 1))
    ends = [s for _, s in tests]
    assert all(_is_int(s) for s in ends)
    assert ends[-1] == result.env_steps
    if kind == "on_policy":
        assert ends == [256, 512, 768]

    # multi_agent_return_reduction(returns) -> returns, before compute_score_fn(stats).
    reductions = rec.of("multi_agent_return_reduction")
    assert len(reductions) == max_epochs
    assert all(isinstance(r, np.ndarray) and r.shape == (test_episodes,) for (r,) in reductions)
    scores = rec.of("compute_score_fn")
    assert len(scores) == max_epochs
    for (raw,), (stats,) in zip(reductions, scores, strict=True):
        assert isinstance(stats, EvalStats)
        np.testing.assert_array_equal(stats.returns, raw * 2.0)
        assert stats.lengths.shape == (test_episodes,)
    test_scores = [float(stats.mean) - 1 for (stats,) in scores]

    # stop_fn(score) -> bool: after every test step with the best test score so far, as
    # Tianshou 2 calls it (and, with test_in_training, with the mean return of the last 20
    # training episodes).
    judged = [s for (s,) in rec.of("stop_fn")]
    assert all(isinstance(s, float) for s in judged)
    it = iter(judged)
    assert all(any(s == t for s in it) for t in itertools.accumulate(test_scores, max))
    assert len(judged) > len(test_scores)

    # save_best_fn(algorithm): with the algorithm, on each new best score.
    best = rec.of("save_best_fn")
    assert all(a == (trainer.algorithm,) for a in best)
    assert len(best) == sum(
        s > max(test_scores[:i], default=-np.inf) for i, s in enumerate(test_scores)
    )
    assert result.best_score == max(test_scores)

    # save_checkpoint_fn(epoch, env_step, gradient_step) -> path: at the end of every epoch,
    # after its test step; the logger's save_data receives the path it returned.
    saved = rec.of("save_checkpoint_fn")
    assert [s[0] for s in saved] == list(range(1, max_epochs + 1))
    assert [s[1] for s in saved] == ends
    assert all(_is_int(g) for _, _, g in saved)
    assert saved[-1][2] == result.gradient_steps
    save_data = rec.of("save_data")
    assert [(e, s, g) for e, s, g, _ in save_data] == saved
    assert [p for *_, p in save_data] == [str(tmp_path / f"ckpt-{e}-{s}-{g}") for e, s, g in saved]
    order = [name for name, _ in rec.calls if name in ("test_fn", "save_checkpoint_fn")]
    assert order == ["test_fn", "save_checkpoint_fn"] * max_epochs

    # logger: training rows at env steps, update rows at gradient steps, test rows.
    assert all(
        _is_int(step) and data["env_step"] == step for data, step in rec.of("log_train_data")
    )
    updates = rec.of("log_update_data")
    assert updates
    assert all(data["gradient_step"] == step for data, step in updates)
    assert [step for _, step in rec.of("log_test_data")] == ends
    assert [data["test/score"] for data, _ in rec.of("log_test_data")] == test_scores


def test_resume_from_log_continues_where_the_run_dir_left_off(tmp_path: Path) -> None:
    def trainer(max_steps: int, **kwargs: Any) -> OnPolicyTrainer:
        envs = make_vec_env("CartPole-v1", 2, seed=0)
        algo = PPO(envs.single_observation_space, envs.single_action_space, seed=0)
        config = TrainerConfig(
            max_steps=max_steps, epoch_num_steps=128, verbose=False, show_progress=False
        )
        return OnPolicyTrainer(algo, envs, None, config, run_dir=tmp_path, **kwargs)

    trainer(256, collection_step_num_env_steps=64, batch_size=32).run()
    resumed = trainer(512, collection_step_num_env_steps=64, batch_size=32, resume_from_log=True)
    assert resumed.counters.env_step == 256
    assert resumed.counters.epoch == 2
    assert resumed.run().epochs == 4


# ------------------------------------------------------- compile and precision options
@pytest.mark.parametrize(
    ("trainer", "message"),
    [
        ({"precision": "fp16"}, "trainer.precision: input should be 'fp32' or 'bf16' (got 'fp16')"),
        ({"compile": "maybe"}, "trainer.compile: input should be a valid boolean"),
    ],
)
def test_bad_compile_and_precision_values_are_one_line_config_errors(
    trainer: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        _cfg(**trainer)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_bf16_is_refused_where_the_cpu_lacks_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: False)
    with pytest.raises(ConfigError, match=r"^trainer.precision: bf16 refused on cpu: .*use fp32$"):
        make_trainer(_cfg(precision="bf16", max_steps=128), None)


@pytest.mark.skipif(not precision.cpu_has_bf16(), reason="this CPU has no bf16 dot products")
def test_bf16_runs_every_update_step_in_bf16_and_acting_in_fp32() -> None:
    trainer = make_trainer(_cfg(precision="bf16", max_steps=256, epoch_num_steps=128), None)
    algorithm = trainer.algorithm
    seen: list[float] = []
    update, act = algorithm.update, algorithm.act
    rounded_away = torch.full((1, 1), 1 + 2**-10)  # exact in fp32, 1.0 in bf16

    def recording_update(*args: Any, **kwargs: Any) -> dict[str, float]:
        seen.append(float(rounded_away @ torch.ones(1, 1)))
        return update(*args, **kwargs)

    def recording_act(*args: Any, **kwargs: Any) -> Any:
        assert float(rounded_away @ torch.ones(1, 1)) == 1 + 2**-10
        return act(*args, **kwargs)

    algorithm.update = recording_update  # type: ignore[method-assign]
    algorithm.act = recording_act  # type: ignore[method-assign]
    trainer.run()
    assert seen
    assert all(s == 1.0 for s in seen)
    assert all(p.dtype == torch.float32 for p in algorithm.net.parameters())
    assert float(rounded_away @ torch.ones(1, 1)) == 1 + 2**-10


def test_compile_is_refused_by_an_algorithm_without_a_compilable_update() -> None:
    cfg = default_run_config(
        "td3", "Pendulum-v1", {"trainer": {"compile": True, "show_progress": False}}
    )
    with pytest.raises(ConfigError, match=r"td3 does not support compiling its update .* ppo"):
        make_trainer(cfg, None)


@pytest.mark.slow  # compiling from a cold cache takes tens of seconds
def test_compiled_update_step_acts_as_the_eager_one_within_tolerance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not bitwise: compiled kernels fuse and round differently, so the weights agree to a
    tolerance and the greedy actions they choose agree exactly on a tiny run."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(INDUCTOR_CACHE_ENV, raising=False)
    # Inductor fixes its cache directory when its modules are first imported: name it first.
    monkeypatch.setenv(INDUCTOR_CACHE_ENV, str(compile_cache_dir()))
    # Kernels an earlier test of this process compiled are reused from memory and not written
    # again: start from empty in-memory caches, so this run's kernels land in its cache dir.
    from torch._inductor.utils import clear_caches  # the compiler: imported only where used

    torch._dynamo.reset()
    clear_caches()
    results = []
    for compiled in (False, True):
        trainer = make_trainer(_cfg(compile=compiled, max_steps=256, epoch_num_steps=256), None)
        trainer.run()
        results.append(trainer.algorithm)
    eager, compiled_algo = results
    torch.testing.assert_close(
        compiled_algo.parameters_vector(), eager.parameters_vector(), atol=1e-4, rtol=1e-4
    )
    obs = torch.as_tensor(np.random.default_rng(0).normal(size=(64, 4)), dtype=torch.float32)
    assert torch.equal(
        compiled_algo.act(obs, deterministic=True).actions,
        eager.act(obs, deterministic=True).actions,
    )
    assert any((tmp_path / "cache" / COMPILE_SUBDIR).rglob("*.so"))
