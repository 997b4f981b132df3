"""mpe2 simple_spread (cooperative, Parallel API): PPO agents improve the team return over
random play. The CI budget is small; bench/marl.py runs the full one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("mpe2")
from mpe2 import simple_spread_v3

from rlfleet.algos.ppo import PPO, PPOConfig
from rlfleet.marl.agents import RandomAgent, make_agents
from rlfleet.marl.collector import MultiAgentTestEpisodes
from rlfleet.marl.trainer import DecentralizedTrainer, MultiAgentSettings
from rlfleet.train.loop import TrainerConfig


def spread() -> Any:
    return simple_spread_v3.parallel_env(N=2, max_cycles=25, continuous_actions=False)


def team_return(episodes: int, agents: list[Any], learning: bool, **options: Any) -> list[float]:
    """The test scores of a run (a test step about every 100 episodes, of 50 agent steps
    each), then the score of its final agents on the same test episodes as every other run
    (paired, so that random and trained agents meet the same starts)."""
    scores: list[float] = []
    config = TrainerConfig(
        max_episodes=episodes, epoch_num_steps=5_000, test_step_num_episodes=48,
        show_progress=False, verbose=False,
    )  # fmt: skip
    settings = MultiAgentSettings(
        learning_mask=[learning] * len(agents), batch_size=512, collection_step_num_episodes=40,
        **options,
    )  # fmt: skip
    trainer = DecentralizedTrainer(
        spread, agents, config, settings, num_envs=8, num_test_envs=8,
        test_result_fn=lambda epoch, step, score: scores.append(score),
    )  # fmt: skip
    trainer.run()
    final = MultiAgentTestEpisodes(trainer.test_envs, trainer.collector, seed=12_345).run(96)
    return [*scores, final.mean]


@pytest.mark.slow
@pytest.mark.parametrize("centralized_critic", [False, True], ids=["shared", "mappo"])
def test_shared_ppo_beats_random(centralized_critic: bool) -> None:
    """Trained agents score 2 above random play on the same test episodes (random: about
    -21.8; trained: -15 to -19 at this budget). The final policy of a run wanders: over eight
    seeds, one run of 400 episodes ended at -20.7 after reaching -16.4, so a second seed is
    tried when the first misses; agents that do not learn still fail both."""
    random_score = team_return(
        8, make_agents(spread, lambda o, a, s: RandomAgent(o, a, seed=s)), False
    )[-1]
    ppo = PPOConfig(learning_rate=1e-3, num_epochs=4, ent_coef=0.01)
    runs = []
    for seed in (0, 100):
        agents = make_agents(
            spread, lambda o, a, s: PPO(o, a, ppo, seed=s), share_parameters=True, seed=seed
        )
        runs.append(team_return(400, agents, True, centralized_critic=centralized_critic))
        if runs[-1][-1] > random_score + 2.0:
            break
    assert runs[-1][-1] > random_score + 2.0, (random_score, runs)


def test_every_learner_and_the_central_critic_follow_the_trainers_nan_policy() -> None:
    agents = make_agents(
        spread, lambda o, a, s: PPO(o, a, PPOConfig(num_epochs=1), seed=s), share_parameters=True
    )
    config = TrainerConfig(
        max_episodes=4, epoch_num_steps=5_000, test_step_num_episodes=2, nan_policy="skip_batch",
        show_progress=False, verbose=False,
    )  # fmt: skip
    settings = MultiAgentSettings(
        batch_size=50, collection_step_num_episodes=2, centralized_critic=True
    )
    trainer = DecentralizedTrainer(spread, agents, config, settings, num_envs=2, num_test_envs=2)
    trainer.run()
    (learner,) = trainer.collector.distinct()
    assert learner.algorithm.nan_policy == "skip_batch"
    assert learner.critic is not None
    assert learner.critic.nan_policy == "skip_batch"


def test_resume_restores_the_central_critic_and_its_optimizer(tmp_path: Path) -> None:
    def trainer(max_episodes: int, resume: bool) -> DecentralizedTrainer:
        agents = make_agents(
            spread, lambda o, a, s: PPO(o, a, PPOConfig(num_epochs=1), seed=s),
            share_parameters=True,
        )  # fmt: skip
        config = TrainerConfig(
            max_episodes=max_episodes, epoch_num_steps=100, test_step_num_episodes=2,
            show_progress=False, verbose=False,
        )  # fmt: skip
        settings = MultiAgentSettings(
            batch_size=50, collection_step_num_episodes=2, centralized_critic=True
        )
        return DecentralizedTrainer(
            spread, agents, config, settings, num_envs=2, num_test_envs=2, run_dir=tmp_path,
            resume_from_log=resume,
        )  # fmt: skip

    first = trainer(4, False)
    first.run()
    (learner,) = first.collector.distinct()
    critic = learner.critic
    assert critic is not None
    assert critic.optimizer.state  # it has stepped
    resumed = trainer(8, True)
    (restored,) = resumed.collector.distinct()
    assert restored.critic is not None
    for saved, loaded in zip(
        critic.net.parameters(), restored.critic.net.parameters(), strict=True
    ):
        assert torch.equal(saved, loaded)
    saved_state = critic.optimizer.state_dict()["state"]
    loaded_state = restored.critic.optimizer.state_dict()["state"]
    assert saved_state.keys() == loaded_state.keys()
    for key in saved_state:
        for name in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(saved_state[key][name], loaded_state[key][name])
