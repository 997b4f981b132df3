"""Reward signals: combining, learning from batches, state, and the demonstration format."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlfleet.data.rollout import RolloutStorage
from rlfleet.errors import ConfigError, EnvSpecError, NonFiniteError
from rlfleet.nn.normalize import RunningNormalizer
from rlfleet.nn.optim import NanPolicy
from rlfleet.rewards import (
    CuriositySettings,
    Demonstrations,
    ExtrinsicSettings,
    GAILSettings,
    RewardSignals,
    RewardSignalsSettings,
    RNDSettings,
    Transitions,
    load_demonstrations,
    record_demonstrations,
    save_demonstrations,
)
from rlfleet.rewards.base import RewardSignal
from rlfleet.rewards.curiosity import CuriositySignal
from rlfleet.rewards.gail import GAILSignal
from rlfleet.rewards.rnd import RNDSignal
from rlfleet.types import PolicyStep
from tests.nan_injection import assert_unchanged, nan_gradients, nan_outputs, optimizer_state

OBS = spaces.Box(-10, 10, (3,), np.float32)
ACT = spaces.Discrete(2)


def _batch(n: int, center: float = 0.0, seed: int = 0) -> Transitions:
    g = torch.Generator().manual_seed(seed)
    obs = center + torch.randn(n, 3, generator=g)
    actions = torch.randint(2, (n,), generator=g)
    next_obs = obs + 0.1 * (actions.float() * 2 - 1).unsqueeze(-1)
    return Transitions(obs, actions, next_obs, torch.ones(n), torch.ones(n))


def test_signals_are_weighted_by_strength_and_zero_on_reset_steps() -> None:
    settings = RewardSignalsSettings(
        extrinsic=ExtrinsicSettings(strength=2.0), rnd=RNDSettings(strength=0.5)
    )
    signals = RewardSignals(settings, OBS, ACT, num_envs=1)
    batch = _batch(8)
    batch.weights[3] = 0.0
    total, parts = signals.combine(batch)
    rnd = signals.signals[1].rewards(batch)
    assert torch.allclose(total, (2.0 * batch.env_rewards + 0.5 * rnd) * batch.weights)
    assert total[3] == 0.0
    assert set(parts) == {"rnd"}
    assert RewardSignals(
        RewardSignalsSettings(extrinsic=ExtrinsicSettings()), OBS, ACT, 1
    ).is_identity


def test_process_rollout_replaces_rewards_and_logs_intrinsic_returns() -> None:
    steps, envs = 6, 2
    storage = RolloutStorage(steps, envs, (3,), ())
    done_at = 2  # env 0's episode ends at step 2; step 3 is its reset step
    for t in range(steps):
        obs = torch.full((envs, 3), float(t))
        step = PolicyStep(actions=torch.zeros(envs, dtype=torch.int64))
        terminated = np.array([t == done_at, False])
        valid = np.array([t != done_at + 1, True])
        storage.insert(t, obs, step, np.ones(envs), terminated, np.zeros(envs, bool), valid)
    settings = RewardSignalsSettings(extrinsic=ExtrinsicSettings(), rnd=RNDSettings(strength=0.1))
    signals = RewardSignals(settings, OBS, ACT, num_envs=envs)
    expected_next = torch.cat([storage.obs[1:], torch.full((1, envs, 3), 99.0)])
    seen: list[Transitions] = []
    original = signals.signals[1].rewards
    signals.signals[1].rewards = lambda batch: (seen.append(batch), original(batch))[1]  # type: ignore[method-assign]
    metrics = signals.process_rollout(
        storage, torch.full((envs, 3), 99.0), batch_size=4, num_epochs=1
    )
    assert torch.equal(seen[0].next_obs, expected_next.reshape(steps * envs, 3))
    assert storage.rewards[done_at + 1, 0] == 0.0  # the reset step earns nothing
    assert torch.all(storage.rewards[:, 1] > 1.0)  # extrinsic 1 plus a positive bonus
    assert "train/intrinsic_rnd_return" in metrics  # env 0 finished an episode
    assert metrics["train/intrinsic_rnd_reward"] > 0
    assert "loss/rnd" in metrics


@pytest.mark.parametrize("name", ["rnd", "curiosity"])
def test_a_rollout_is_rewarded_before_the_signals_learn_from_it(name: str) -> None:
    """docs/reward-signals-and-curricula.md: each signal first computes rewards for the
    rollout, and only then learns from it: the rollout's rewards are those the signal gave
    before this rollout's update, which then changes what it gives."""
    steps, envs = 6, 2
    storage = RolloutStorage(steps, envs, (3,), ())
    g = torch.Generator().manual_seed(0)
    ones = np.ones(envs, bool)
    for t in range(steps):
        step = PolicyStep(actions=torch.randint(2, (envs,), generator=g))
        obs = torch.randn(envs, 3, generator=g)
        storage.insert(t, obs, step, np.zeros(envs), ~ones, ~ones, ones)
    intrinsic: dict[str, Any] = {
        "rnd": RNDSettings(strength=1.0), "curiosity": CuriositySettings(strength=1.0)
    }  # fmt: skip
    signals = RewardSignals(RewardSignalsSettings(**{name: intrinsic[name]}), OBS, ACT, envs)
    signal = signals.signals[0]
    before = copy.deepcopy(signal)
    events: list[str] = []
    seen: list[Transitions] = []
    rewards, update = signal.rewards, signals.update

    def recording_rewards(batch: Transitions) -> torch.Tensor:
        events.append("rewards")
        seen.append(batch)
        return rewards(batch)

    def recording_update(batch: Transitions, **kwargs: Any) -> dict[str, float]:
        events.append("update")
        return update(batch, **kwargs)

    signal.rewards = recording_rewards  # type: ignore[method-assign]
    signals.update = recording_update  # type: ignore[method-assign]
    signals.process_rollout(storage, torch.randn(envs, 3, generator=g), batch_size=4, num_epochs=2)
    assert events == ["rewards", "update"]
    given = storage.rewards.reshape(-1)
    torch.testing.assert_close(given, before.rewards(seen[0]))
    assert not torch.allclose(given, rewards(seen[0]))  # the update changed the signal


def test_rollout_actions_reach_the_signals_as_env_actions() -> None:
    """A rollout stores the policy's indices 0..n-1; a Discrete(3, start=5) space's signals
    see env actions 5..7, as replay buffers and demonstrations give them."""
    steps, envs = 4, 2
    storage = RolloutStorage(steps, envs, (3,), ())
    for t in range(steps):
        step = PolicyStep(actions=torch.tensor([t % 3, (t + 1) % 3]))
        ones = np.ones(envs, bool)
        storage.insert(t, torch.zeros(envs, 3), step, np.ones(envs), ~ones, ~ones, ones)
    settings = RewardSignalsSettings(curiosity=CuriositySettings(strength=0.1))
    signals = RewardSignals(settings, OBS, spaces.Discrete(3, start=5), num_envs=envs)
    seen: list[Transitions] = []
    original = signals.signals[0].rewards
    signals.signals[0].rewards = lambda batch: (seen.append(batch), original(batch))[1]  # type: ignore[method-assign]
    signals.process_rollout(storage, torch.zeros(envs, 3), batch_size=4, num_epochs=1)
    assert torch.equal(seen[0].actions, storage.actions.reshape(-1) + 5)


def test_rnd_rewards_novel_observations_more() -> None:
    signal = RNDSignal(RNDSettings(learning_rate=1e-3), OBS, ACT, seed=0)
    familiar = _batch(512, center=0.0)
    for _ in range(30):
        signal.update(familiar, batch_size=128, num_epochs=1)
    novel = _batch(512, center=6.0, seed=1)
    both = Transitions(
        torch.cat([familiar.obs, novel.obs]), torch.cat([familiar.actions, novel.actions]),
        torch.cat([familiar.next_obs, novel.next_obs]), torch.ones(1024), torch.ones(1024),
    )  # fmt: skip
    rewards = signal.rewards(both)
    assert rewards[512:].mean() > 3 * rewards[:512].mean()


def test_curiosity_learns_the_dynamics_it_sees() -> None:
    signal = CuriositySignal(CuriositySettings(learning_rate=1e-3), OBS, ACT, seed=0)
    batch = _batch(512)
    first = signal.update(batch, batch_size=128, num_epochs=1)
    for _ in range(40):
        last = signal.update(batch, batch_size=128, num_epochs=1)
    assert last["loss/curiosity_inverse"] < 0.5 * first["loss/curiosity_inverse"]
    assert signal.rewards(batch).shape == (512,)
    assert torch.isfinite(signal.rewards(batch)).all()


def test_continuous_actions_work_too() -> None:
    box = spaces.Box(-1, 1, (2,), np.float32)
    signal = CuriositySignal(CuriositySettings(), OBS, box, seed=0)
    batch = Transitions(torch.randn(16, 3), torch.rand(16, 2), torch.randn(16, 3),
                        torch.ones(16), torch.ones(16))  # fmt: skip
    assert signal.update(batch, batch_size=8, num_epochs=1)["loss/curiosity_inverse"] > 0


def test_gail_rewards_demonstrator_like_transitions_more(tmp_path: Path) -> None:
    expert = _batch(400, center=2.0, seed=3)
    path = tmp_path / "demos.npz"
    save_demonstrations(path, Demonstrations(expert.obs.numpy(), expert.actions.numpy()))
    signal = GAILSignal(GAILSettings(demo_path=str(path), learning_rate=1e-3), OBS, ACT, seed=0)
    agent = _batch(400, center=-2.0, seed=4)
    for _ in range(20):
        metrics = signal.update(agent, batch_size=100, num_epochs=1)
    assert metrics["train/gail_expert_estimate"] > metrics["train/gail_policy_estimate"]
    assert (
        signal.rewards(_batch(200, 2.0, 5)).mean() > 2 * signal.rewards(_batch(200, -2.0, 6)).mean()
    )


def test_state_round_trip_gives_the_same_rewards() -> None:
    settings = RewardSignalsSettings(curiosity=CuriositySettings(), rnd=RNDSettings())
    a = RewardSignals(settings, OBS, ACT, num_envs=2, seed=0)
    for signal in a.signals:
        signal.update(_batch(64), batch_size=32, num_epochs=1)
    b = RewardSignals(settings, OBS, ACT, num_envs=2, seed=1)
    b.load_state_dict(a.state_dict())
    batch = _batch(32, seed=9)
    assert torch.equal(a.combine(batch)[0], b.combine(batch)[0])


def test_learned_signals_refuse_spaces_they_cannot_read() -> None:
    with pytest.raises(EnvSpecError, match="needs Box observations"):
        RNDSignal(RNDSettings(), spaces.Discrete(4), ACT)
    with pytest.raises(EnvSpecError, match="needs Discrete or Box actions"):
        CuriositySignal(CuriositySettings(), OBS, spaces.MultiBinary(3))


# ----------------------------------------------------------- demonstrations
def test_record_save_load_round_trip(tmp_path: Path) -> None:
    env = gym.make("CartPole-v1")
    demos, returns = record_demonstrations(
        env, lambda o: int(o[2] + 0.5 * o[3] > 0), num_episodes=2, seed=0
    )
    assert returns == [500.0, 500.0]  # the hand-written controller balances
    path = tmp_path / "demos.npz"
    save_demonstrations(path, demos)
    loaded = load_demonstrations(path, env.observation_space, env.action_space)
    assert np.array_equal(loaded.observations, demos.observations)
    assert np.array_equal(loaded.actions, demos.actions)
    assert loaded.actions.dtype == np.int64
    assert len(loaded) == 1000


def _write(path: Path, **arrays: Any) -> Path:
    with path.open("wb") as f:
        np.savez(f, **arrays)
    return path


@pytest.mark.parametrize(
    ("arrays", "match"),
    [
        ({"observations": np.zeros((4, 3), np.float32)}, "lacks array"),
        ({"observations": np.zeros((4, 5)), "actions": np.zeros(4, np.int64)}, "shape"),
        ({"observations": np.zeros((4, 3)), "actions": np.full(4, 7)}, "outside"),
        ({"observations": np.zeros((4, 3)), "actions": np.zeros(4)}, "integers"),
        ({"observations": np.full((4, 3), np.nan), "actions": np.zeros(4, int)}, "finite"),
        ({"observations": np.array([{"a": 1}] * 4), "actions": np.zeros(4, int)}, "pickled"),
    ],
)
def test_bad_demonstration_files_are_refused(
    tmp_path: Path, arrays: dict[str, Any], match: str
) -> None:
    path = _write(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ConfigError, match=match) as info:
        load_demonstrations(path, OBS, ACT)
    assert str(path) in str(info.value)


def test_demonstrated_box_actions_must_be_finite(tmp_path: Path) -> None:
    actions = np.zeros((4, 1), np.float32)
    actions[2] = np.inf
    path = _write(tmp_path / "bad.npz", observations=np.zeros((4, 3)), actions=actions)
    with pytest.raises(ConfigError, match="actions must be finite"):
        load_demonstrations(path, OBS, spaces.Box(-1, 1, (1,), np.float32))


def test_missing_and_non_npz_demonstrations(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_demonstrations(tmp_path / "none.npz", OBS, ACT)
    text = tmp_path / "text.npz"
    text.write_text("not a zip")
    with pytest.raises(ConfigError, match="not a readable demonstration"):
        load_demonstrations(text, OBS, ACT)


def _learned_signal(kind: str, tmp_path: Path) -> RewardSignal:
    if kind == "curiosity":
        return CuriositySignal(CuriositySettings(), OBS, ACT, seed=0)
    if kind == "rnd":
        return RNDSignal(RNDSettings(), OBS, ACT, seed=0)
    expert = _batch(64, center=2.0, seed=3)
    path = tmp_path / "demos.npz"
    save_demonstrations(path, Demonstrations(expert.obs.numpy(), expert.actions.numpy()))
    return GAILSignal(GAILSettings(demo_path=str(path)), OBS, ACT, seed=0)


@pytest.mark.parametrize("kind", ["curiosity", "rnd", "gail"])
def test_every_learned_signal_normalises_its_inputs_with_running_statistics(
    kind: str, tmp_path: Path
) -> None:
    signal = _learned_signal(kind, tmp_path)
    (normalizer,) = [m for m in signal.modules().values() if isinstance(m, RunningNormalizer)]
    before = normalizer.mean.clone()
    signal.update(_batch(256, center=-5.0, seed=1), batch_size=64, num_epochs=1)
    # The statistics follow the observations seen (GAIL's began with its demonstrations').
    assert (normalizer.mean < before - 1.0).all()
    obs = torch.full((1, 3), -5.0)
    assert normalizer(obs).abs().max() < normalizer(obs + 10.0).abs().max()


@pytest.mark.parametrize("injection", ["loss", "gradient"])
@pytest.mark.parametrize("nan_policy", ["raise", "skip_batch"])
@pytest.mark.parametrize("kind", ["curiosity", "rnd", "gail"])
def test_a_non_finite_loss_or_gradient_never_reaches_a_signals_weights(
    kind: str, nan_policy: NanPolicy, injection: str, tmp_path: Path
) -> None:
    signal = _learned_signal(kind, tmp_path)
    signal.update(_batch(64), batch_size=32, num_epochs=1)  # optimiser state to compare
    signal.nan_policy = nan_policy
    modules = list(signal.modules().values())
    params = [p.detach().clone() for m in modules for p in m.parameters()]
    state = optimizer_state(signal.optimizers().values())
    if injection == "loss":
        nan_outputs(modules)
    else:
        nan_gradients(p for m in modules for p in m.parameters())
    if nan_policy == "raise":
        with pytest.raises(NonFiniteError, match=rf"^reward signal '{kind}': non-finite loss"):
            signal.update(_batch(64, seed=1), batch_size=32, num_epochs=2)
    else:
        signal.update(_batch(64, seed=1), batch_size=32, num_epochs=2)
        assert signal.skipped_batches == 4  # 2 minibatches x 2 epochs
    assert_unchanged(params, [p.detach() for m in modules for p in m.parameters()], "weights")
    assert_unchanged(state, optimizer_state(signal.optimizers().values()), "optimizer state")


def test_signals_take_one_nan_policy_and_keep_their_skip_count_in_their_state() -> None:
    settings = RewardSignalsSettings(curiosity=CuriositySettings(), rnd=RNDSettings())
    signals = RewardSignals(settings, OBS, ACT, num_envs=2)
    signals.set_nan_policy("skip_batch")
    assert all(s.nan_policy == "skip_batch" for s in signals.signals)
    for signal in signals.signals:
        nan_gradients(p for m in signal.modules().values() for p in m.parameters())
    signals.update(_batch(64), batch_size=32, num_epochs=1)
    assert signals.skipped_batches == 4  # 2 learned signals x 2 minibatches
    restored = RewardSignals(settings, OBS, ACT, num_envs=2)
    restored.load_state_dict(signals.state_dict())
    assert restored.skipped_batches == 4


def test_demonstrations_that_cannot_be_written_are_a_run_dir_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk: one RunDirError naming the file and the free space; an earlier file of
    that name stays, and no temporary file is left."""
    import errno

    from rlfleet.errors import RunDirError
    from rlfleet.rewards.demonstrations import (
        Demonstrations,
        load_demonstrations,
        save_demonstrations,
    )

    demos = Demonstrations(np.zeros((3, 2), np.float32), np.zeros(3, np.int64))
    save_demonstrations(tmp_path / "demos.npz", demos)
    before = (tmp_path / "demos.npz").read_bytes()

    def no_space(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "savez_compressed", no_space)
    with pytest.raises(RunDirError, match=r"demos\.npz: cannot write \(No space left on device; "):
        save_demonstrations(tmp_path / "demos.npz", demos)
    assert (tmp_path / "demos.npz").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demos.npz"]
    monkeypatch.undo()
    box = spaces.Box(-1.0, 1.0, (2,), np.float32)
    assert len(load_demonstrations(tmp_path / "demos.npz", box, spaces.Discrete(2))) == 3
