"""Multi-agent checkpoints: a resumed run continues its counters, weights, buffers and
self-play; bad resumes are refused."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import torch

pytest.importorskip("pettingzoo")
from pettingzoo.classic import tictactoe_v3

from rlfleet.algos.base import Algorithm
from rlfleet.algos.dqn import DQN, DQNConfig
from rlfleet.algos.ppo import PPO, PPOConfig
from rlfleet.cli.main import main
from rlfleet.errors import CheckpointError, ConfigError
from rlfleet.marl.agents import make_agents
from rlfleet.marl.envs import MultiAgentVecEnv
from rlfleet.marl.selfplay import SelfPlayConfig
from rlfleet.marl.trainer import DecentralizedTrainer, MultiAgentSettings
from rlfleet.train.loop import TrainerConfig

TICTACTOE = "pettingzoo:pettingzoo.classic.tictactoe_v3"
SETTINGS = MultiAgentSettings(
    batch_size=16, collection_step_num_env_steps=4, collection_step_num_episodes=10
)


def _config(max_episodes: int) -> TrainerConfig:
    return TrainerConfig(
        max_episodes=max_episodes, epoch_num_steps=150, test_step_num_episodes=2,
        log_interval_steps=1, show_progress=False, verbose=False,
    )  # fmt: skip


def _mixed_agents() -> list[Algorithm[Any]]:
    envs = MultiAgentVecEnv(tictactoe_v3.env, 1)
    obs, act = envs.observation_spaces["player_1"], envs.action_spaces["player_1"]
    return [
        PPO(obs, act, PPOConfig(num_epochs=1), seed=0),
        DQN(obs, act, DQNConfig(learning_starts=0), seed=1),
    ]


def _trainer(
    run_dir: Path | None, max_episodes: int, agents: Any, *, resume: bool = False, **hooks: Any
) -> DecentralizedTrainer:
    return DecentralizedTrainer(
        tictactoe_v3.env, agents, _config(max_episodes), hooks.pop("settings", SETTINGS),
        num_envs=2, num_test_envs=2, run_dir=run_dir, resume_from_log=resume, **hooks,
    )  # fmt: skip


def test_resume_continues_counters_weights_and_buffers(tmp_path: Path) -> None:
    trained = _mixed_agents()
    first = _trainer(tmp_path, 40, trained)
    done = first.run()
    assert (tmp_path / "checkpoints" / "latest.json").is_file()
    dqn_steps = trained[1].gradient_steps
    assert dqn_steps > 0

    seen: list[tuple[int, torch.Tensor, torch.Tensor, int]] = []

    def before_training_step(epoch: int, env_step: int) -> None:
        ppo, dqn = fresh
        seen.append(
            (env_step, ppo.parameters_vector(), dqn.parameters_vector(), dqn.gradient_steps)
        )

    fresh = _mixed_agents()
    assert not torch.equal(fresh[0].parameters_vector(), trained[0].parameters_vector())
    second = _trainer(tmp_path, 60, fresh, resume=True, training_fn=before_training_step)
    saved, restored = first.learners["player_2"].buffer, second.learners["player_2"].buffer
    assert saved is not None
    assert restored is not None
    assert len(restored) == len(saved) > 0  # the replay buffer came back
    result = second.run()

    env_step, ppo_params, dqn_params, steps = seen[0]
    assert env_step == done.env_steps  # the resumed run starts where the first one ended
    assert torch.equal(ppo_params, trained[0].parameters_vector())
    assert torch.equal(dqn_params, trained[1].parameters_vector())
    assert steps == dqn_steps
    # Copies finishing together may overshoot a collection step by an episode.
    assert 60 <= result.episodes <= 62
    assert second.train_returns.shape == (result.episodes, 2)
    history = pq.read_table(tmp_path / "history.parquet").to_pydict()
    assert history["env_step"] == sorted(history["env_step"])  # rows after the checkpoint dropped
    assert history["episode"][-1] == result.episodes


def test_self_play_state_survives_a_resume(tmp_path: Path) -> None:
    settings = replace(
        SETTINGS,
        self_play=SelfPlayConfig(
            save_steps=40, swap_steps=20, window=3, play_against_latest_model_ratio=0.0
        ),
    )

    def elo_after(max_episodes: int, *, resume: bool) -> list[float]:
        agents = make_agents(
            tictactoe_v3.env,
            lambda o, a, s: PPO(o, a, PPOConfig(num_epochs=1), seed=s),
            share_parameters=True,
        )
        _trainer(tmp_path, max_episodes, agents, resume=resume, settings=settings).run()
        history = pq.read_table(tmp_path / "history.parquet").to_pydict()
        return [e for e in history["selfplay/elo"] if e is not None]

    first = elo_after(40, resume=False)
    second = elo_after(60, resume=True)
    assert second[: len(first)] == first  # the saved ratings, then new ones
    assert len(second) >= len(first) + 2
    assert second[-1] != first[-1]


def test_resume_with_other_agents_is_refused(tmp_path: Path) -> None:
    def ppo_agents(share: bool) -> list[Algorithm[Any]]:
        build = lambda o, a, s: PPO(o, a, PPOConfig(num_epochs=1), seed=s)  # noqa: E731
        return make_agents(tictactoe_v3.env, build, share_parameters=share)

    _trainer(tmp_path, 20, ppo_agents(False)).run()
    with pytest.raises(CheckpointError, match=r"player_1\+player_2"):
        _trainer(tmp_path, 40, ppo_agents(True), resume=True)
    with pytest.raises(ConfigError, match=r"is for 'ppo', not 'ppo\+dqn'"):
        _trainer(tmp_path, 40, _mixed_agents(), resume=True)
    with pytest.raises(ConfigError, match="resuming needs a run_dir"):
        _trainer(None, 20, _mixed_agents(), resume=True)
    with pytest.raises(CheckpointError, match="no checkpoint found"):
        _trainer(tmp_path / "empty", 20, _mixed_agents(), resume=True)


def test_cli_resume_continues_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    config = tmp_path / "shared.yaml"
    config.write_text(
        f"algo: ppo\nenv: {{id: '{TICTACTOE}', num_envs: 2, num_test_envs: 2}}\n"
        "multi_agent: {share_parameters: true}\n"
    )
    args = ["train", "ppo", "--config", str(config), "--max-episodes", "20"]
    args += ["--epoch-num-steps", "1000", "--test-step-num-episodes", "2", "--num-epochs", "1"]
    args += ["--run-dir", str(run_dir), "--no-show-progress", "--no-verbose"]
    assert main(args) == 0
    resume = ["train", "ppo", "--resume", str(run_dir), "--max-episodes", "40", "--no-verbose"]
    assert main(resume) == 0
    history = pq.read_table(run_dir / "history.parquet").to_pydict()
    tested = [
        e for e, s in zip(history["episode"], history["test/score"], strict=True) if s is not None
    ]
    assert len(tested) == 2
    assert 20 <= tested[0] <= 22
    assert 40 <= tested[1] <= 42
    assert (run_dir / "best").is_dir()
    assert "share_parameters: true" in (run_dir / "config.yaml").read_text()
    assert main(["train", "dqn", "--resume", str(run_dir)]) == 2
    assert "is a ppo run, not dqn" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda state: state.pop("run"), r"state\.json: run: missing"),
        (lambda state: state.update(run=[1, 2]), r"state\.json: run: .*dict"),
        (
            lambda state: state.update(run={"learners": "none"}),
            r"the latest checkpoint's state\.json does not fit this ppo trainer \(",
        ),
    ],
)
def test_a_crafted_multi_agent_state_is_a_checkpoint_error(
    tmp_path: Path, edit: Any, message: str
) -> None:
    """A checksum-consistent state.json with the collector's part missing, mistyped or not
    what this trainer wrote: one CheckpointError, not a KeyError or TypeError."""
    from rlfleet.checkpoint import CheckpointManager
    from tests.checkpoint.test_durable import rewrite

    def ppo_agents() -> list[Algorithm[Any]]:
        build = lambda o, a, s: PPO(o, a, PPOConfig(num_epochs=1), seed=s)  # noqa: E731
        return make_agents(tictactoe_v3.env, build, share_parameters=True)

    _trainer(tmp_path, 20, ppo_agents()).run()
    latest = CheckpointManager(tmp_path / "checkpoints", readonly=True).latest()
    assert latest is not None
    state = json.loads((latest / "state.json").read_text())
    edit(state)
    rewrite(latest, "state.json", json.dumps(state).encode())
    with pytest.raises(CheckpointError, match=message):
        _trainer(tmp_path, 40, ppo_agents(), resume=True)


def test_a_resume_starts_a_new_episode_in_every_copy_seeded_from_the_episode_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import numpy as np

    first = _trainer(tmp_path, 20, _mixed_agents())
    episodes = first.run().episodes
    resets: list[tuple[int, int | None]] = []
    reset = MultiAgentVecEnv.reset

    def recording_reset(envs: MultiAgentVecEnv, seed: int | None = None) -> Any:
        resets.append((envs.num_envs, seed))
        return reset(envs, seed=seed)

    monkeypatch.setattr(MultiAgentVecEnv, "reset", recording_reset)
    second = _trainer(tmp_path, 30, _mixed_agents(), resume=True)
    expected = int(np.random.SeedSequence([0, episodes]).generate_state(1)[0])
    assert (2, expected) in resets  # both training copies, from the seed and the count
    assert second.collector.pending == {}  # no trajectory carried over
    second.close()
