"""Independent random streams from one run seed."""

from __future__ import annotations

import numpy as np
import torch
from gymnasium import spaces

from rlfleet.algos.dqn import DQN, DQNConfig
from rlfleet.seeding import EPISODE_SEED_SPAN, episode_seed, stream_seed


def test_stream_seeds_are_fixed_and_distinct() -> None:
    seeds = {stream_seed(s, stream) for s in range(50) for stream in ("algorithm", "replay")}
    assert len(seeds) == 100
    assert all(0 <= s < 2**63 for s in seeds)
    assert stream_seed(7, "replay") == stream_seed(7, "replay")


def test_algorithm_draws_do_not_repeat_its_initial_weights() -> None:
    # The global torch RNG initialises the network with the run seed; the algorithm's own
    # generator must not replay those numbers as its exploration draws.
    obs = spaces.Box(-np.inf, np.inf, (4,), np.float32)
    algo = DQN(obs, spaces.Discrete(2), DQNConfig(hidden_sizes=(256, 256)), seed=8)
    draws = torch.rand(1024, generator=algo.generator)
    init_draws = torch.rand(1024, generator=torch.Generator().manual_seed(8))
    assert not torch.equal(draws, init_draws)
    weights = algo.q_net.q[0].weight.detach().flatten()
    agreement = ((draws < 0.5) == (weights > 0)).float().mean().item()
    assert 0.4 < agreement < 0.6


def test_replay_sampler_does_not_share_the_env_reset_stream() -> None:
    obs = spaces.Box(-np.inf, np.inf, (4,), np.float32)
    algo = DQN(obs, spaces.Discrete(2), DQNConfig(), seed=8)
    sampler = algo.replay_sampler()
    env_stream = np.random.default_rng(8).bit_generator.state["state"]
    assert sampler.rng.bit_generator.state["state"] != env_stream  # type: ignore[attr-defined]


def test_neighbouring_run_seeds_test_on_unrelated_episodes() -> None:
    """A run's test steps reset sub-env ``i`` of test step ``k`` with ``base + 10 k + i`` (ten
    episodes a step): runs with neighbouring seeds must not share those start seeds, or one
    set of episodes moves every seed's score alike."""
    for stream in ("test", "evaluation"):
        bases = [episode_seed(seed, stream) for seed in range(20)]
        assert all(0 <= b < EPISODE_SEED_SPAN for b in bases)
        played = [set(range(b, b + 10 * 100)) for b in bases]  # 100 test steps of 10
        for a in range(20):
            for b in range(a + 1, 20):
                assert not played[a] & played[b]
    assert episode_seed(3, "test") != episode_seed(3, "evaluation")
    assert episode_seed(3, "test") == episode_seed(3, "test")


def test_a_trainer_tests_on_the_episodes_of_its_own_seed() -> None:
    from rlfleet.runs.config import default_run_config
    from rlfleet.runs.run import make_trainer

    quiet = {"show_progress": False, "verbose": False, "max_steps": 64, "epoch_num_steps": 64}
    cfg = default_run_config("ppo", "CartPole-v1", {"seed": 4, "trainer": quiet})
    trainer = make_trainer(cfg, None)
    try:
        assert trainer.evaluator is not None
        assert trainer.evaluator.seed == episode_seed(4, "test")
    finally:
        trainer.close()
