"""Defaults adapted to an env the presets do not name: each rule, what wins over what, and
when nothing is probed."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from rlfleet.algos.registry import get_algorithm
from rlfleet.config.loader import has_named_preset
from rlfleet.envs import probe
from rlfleet.envs.probe import EnvProfile
from rlfleet.errors import EnvSpecError
from rlfleet.runs import adapt
from rlfleet.runs.adapt import adaptations, adapted_lines, adapted_preset, family
from rlfleet.runs.config import default_run_config, run_config_from_dict, run_config_to_dict

PENALTY = "tests.envs.test_probe:PenaltyEnv"
"""-1 per step, truncated, never terminates, one badly scaled observation entry."""

PLAIN = EnvProfile(
    env_id="Plain-v0",
    action_kind="discrete",
    observation_kind="vector",
    observation_bounded=True,
    observation_std=(0.5, 1.0),
    observation_abs_max=2.0,
    steps=2000,
    episodes=20,
    mean_episode_length=100.0,
    truncated_share=0.0,
    reached_terminal=True,
    max_episode_steps=500,
    reward_abs_max=1.0,
    reward_max=1.0,
    reward_std=0.5,
    reward_nonzero_share=0.5,
    reward_constant_share=0.5,
    most_common_reward=1.0,
)
"""A profile no rule acts on: unit-scale observations, an informative reward."""


def keys(algo: str, profile: EnvProfile, base: dict[str, Any] | None = None) -> dict[str, Any]:
    return {a.key: a.value for a in adaptations(get_algorithm(algo), profile, base or {})}


@pytest.mark.parametrize("algo", ["ppo", "a2c", "trpo", "dqn", "sac"])
def test_a_plain_profile_adapts_nothing(algo: str) -> None:
    plain = replace(PLAIN, mean_episode_length=None, observation_kind="image", episodes=0)
    assert keys(algo, replace(plain, observation_std=())) == {}


@pytest.mark.parametrize("algo", ["ppo", "a2c", "trpo", "dqn"])
@pytest.mark.parametrize("std", [(0.01, 1.0), (0.5, 20.0)])
def test_badly_scaled_observations_are_normalised(algo: str, std: tuple[float, ...]) -> None:
    plain = keys(algo, PLAIN)
    assert "hyperparameters.normalize_obs" not in plain
    assert keys(algo, replace(PLAIN, observation_std=std)) == {
        **plain,
        "hyperparameters.normalize_obs": True,
    }


def test_constant_observation_entries_and_images_are_not_scaled() -> None:
    assert keys("ppo", replace(PLAIN, observation_std=(0.0, 1.0))) == {}
    assert keys("ppo", replace(PLAIN, observation_kind="image", observation_std=())) == {}


@pytest.mark.parametrize("algo", ["ppo", "a2c", "trpo"])
def test_a_constant_penalty_or_a_sparse_reward_is_normalised(algo: str) -> None:
    penalty = replace(PLAIN, reward_constant_share=1.0, most_common_reward=-1.0)
    sparse = replace(
        PLAIN, reward_nonzero_share=0.01, reward_constant_share=0.99, most_common_reward=0.0
    )
    for profile in (penalty, sparse):
        assert keys(algo, profile) == {"hyperparameters.normalize_reward": True}


def test_a_survival_bonus_is_not_normalised() -> None:
    bonus = replace(PLAIN, reward_constant_share=1.0, most_common_reward=1.0)
    assert keys("ppo", bonus) == {}
    unbounded = replace(bonus, observation_bounded=False)
    assert keys("ppo", unbounded) == {"hyperparameters.normalize_obs": True}


@pytest.mark.parametrize("algo", ["ppo", "a2c", "trpo", "acer"])
def test_an_unbounded_task_normalises_observations_and_rewards(algo: str) -> None:
    unbounded = replace(PLAIN, observation_bounded=False)
    assert keys(algo, unbounded) == {
        "hyperparameters.normalize_obs": True,
        "hyperparameters.normalize_reward": True,
    }
    [rule] = [a for a in adaptations(get_algorithm(algo), unbounded, {}) if "reward" in a.key]
    assert "unbounded" in rule.reason
    images = replace(unbounded, observation_kind="image", observation_std=())
    assert keys(algo, images) == {}


def test_dqn_normalises_the_observations_of_an_unbounded_task() -> None:
    unbounded = replace(PLAIN, observation_bounded=False)
    assert "hyperparameters.normalize_obs" not in keys("dqn", PLAIN)
    assert keys("dqn", unbounded)["hyperparameters.normalize_obs"] is True


def test_dqn_warms_up_on_a_few_episodes_unless_the_preset_does() -> None:
    assert keys("dqn", PLAIN)["hyperparameters.learning_starts"] == 500
    long = keys("dqn", replace(PLAIN, mean_episode_length=1e5))
    assert long["hyperparameters.learning_starts"] == adapt.MAX_WARMUP_STEPS
    preset = {"hyperparameters": {"learning_starts": 1000}}
    assert "hyperparameters.learning_starts" not in keys("dqn", PLAIN, preset)
    assert "hyperparameters.learning_starts" not in keys(
        "dqn", replace(PLAIN, mean_episode_length=None)
    )


def test_dqn_target_follows_every_few_episodes() -> None:
    # 5 episodes of 100 steps at 1 gradient step per 4 env steps (the defaults).
    assert keys("dqn", PLAIN)["hyperparameters.target_update_interval"] == 125
    preset = {"hyperparameters": {"train_freq": 8, "gradient_steps": 4}}
    assert keys("dqn", PLAIN, preset)["hyperparameters.target_update_interval"] == 250
    slow = {"hyperparameters": {"target_update_interval": 100}}
    assert "hyperparameters.target_update_interval" not in keys("dqn", PLAIN, slow)


def test_dqn_takes_n_step_returns_where_the_reward_is_uninformative() -> None:
    assert "hyperparameters.n_step" not in keys("dqn", PLAIN)
    penalty = replace(PLAIN, reward_constant_share=1.0, most_common_reward=-1.0)
    assert keys("dqn", penalty)["hyperparameters.n_step"] == adapt.SPARSE_N_STEP
    preset = {"hyperparameters": {"n_step": 5}}
    assert "hyperparameters.n_step" not in keys("dqn", penalty, preset)


@pytest.mark.parametrize(
    ("name", "floor", "above"),
    [
        ("learning_rate", adapt.VECTOR_DQN_LEARNING_RATE, 0.003),
        ("batch_size", adapt.VECTOR_DQN_BATCH_SIZE, 256),
    ],
)
def test_dqn_on_vector_observations_learns_faster_than_on_images(
    name: str, floor: float, above: float
) -> None:
    key = f"hyperparameters.{name}"
    assert keys("dqn", PLAIN)[key] == floor
    image = replace(PLAIN, observation_kind="image", observation_std=())
    assert key not in keys("dqn", image)
    assert key not in keys("dqn", PLAIN, {"hyperparameters": {name: above}})


def test_families() -> None:
    assert family(get_algorithm("ppo")) == "on_policy"
    assert family(get_algorithm("dqn")) == "dqn"
    assert family(get_algorithm("sac")) == "sac"
    for name in ("td3", "ddpg"):
        assert family(get_algorithm(name)) == "off_policy"
    for name in ("appo", "impala"):
        assert family(get_algorithm(name)) == "actor_learner"
    for name in ("bc", "cql", "iql", "td3_bc"):
        assert family(get_algorithm(name)) is None


NOTHING_FOUND = replace(
    PLAIN,
    action_kind="continuous",
    reached_terminal=False,
    truncated_share=1.0,
    reward_max=-0.0,
    reward_constant_share=0.01,
    most_common_reward=-0.05,
)
"""MountainCarContinuous under random play: every episode runs into its time limit, and
each step's reward is the (varying) cost of the action, never above zero. The zero action
was not played (``zero_action_return`` None): the rules then read it as nothing found, and
where it was, only a zero action that costs nothing keeps it so."""


def test_nothing_is_found_where_doing_nothing_costs_nothing_too() -> None:
    # MountainCarContinuous with its zero-action episodes: no torque costs nothing.
    idle = replace(NOTHING_FOUND, zero_action_return=0.0, zero_action_truncated=True)
    assert keys("sac", idle) == keys("sac", NOTHING_FOUND) != {}
    for algo in ("ppo", "impala", "td3"):
        assert keys(algo, idle) == keys(algo, NOTHING_FOUND)
    # Each reason says what the rule read, the zero action where the probe played it.
    for profile, said in ((idle, True), (NOTHING_FOUND, False)):
        for rule in adaptations(get_algorithm("td3"), profile, {}):
            assert rule.reason.startswith("random play never ended an episode")
            assert ("doing nothing returned 0" in rule.reason) is said


@pytest.mark.parametrize("algo", ["ppo", "a2c", "trpo"])
def test_where_random_play_finds_nothing_on_policy_gets_pink_noise_and_reward_scaling(
    algo: str,
) -> None:
    assert keys(algo, NOTHING_FOUND) == {
        "hyperparameters.normalize_reward": True,
        "hyperparameters.action_noise_color": adapt.PINK_NOISE,
    }


@pytest.mark.parametrize("algo", ["appo", "impala"])
def test_where_random_play_finds_nothing_actor_learners_get_pink_noise(algo: str) -> None:
    # They have no reward normalisation; with pink noise and normalised observations both
    # reached MountainCarContinuous-v0's goal on seeds 0-2 at 100k steps (docs/user-guide.md).
    assert keys(algo, NOTHING_FOUND) == {"hyperparameters.action_noise_color": adapt.PINK_NOISE}
    small = replace(NOTHING_FOUND, observation_std=(0.5, 0.007))
    assert keys(algo, small) == {
        "hyperparameters.action_noise_color": adapt.PINK_NOISE,
        "hyperparameters.normalize_obs": True,
    }


def test_where_random_play_finds_nothing_sac_gets_pink_noise_and_a_long_horizon() -> None:
    assert keys("sac", NOTHING_FOUND) == {
        "hyperparameters.action_noise_color": adapt.PINK_NOISE,
        "hyperparameters.gamma": adapt.LONG_HORIZON_GAMMA,
    }
    preset = {"hyperparameters": {"action_noise_color": 2.0, "gamma": 0.9995}}
    assert keys("sac", NOTHING_FOUND, preset) == {}


@pytest.mark.parametrize(
    ("time_limit", "gamma", "adapted"),
    [(500, 0.99, True), (100, 0.99, False), (None, 0.99, False), (500, 0.998, False)],
)
def test_sacs_horizon_reaches_over_the_episode_only_where_it_falls_short(
    time_limit: int | None, gamma: float, adapted: bool
) -> None:
    profile = replace(NOTHING_FOUND, max_episode_steps=time_limit)
    preset = {"hyperparameters": {"gamma": gamma}}
    assert ("hyperparameters.gamma" in keys("sac", profile, preset)) is adapted


@pytest.mark.parametrize("algo", ["td3", "ddpg"])
def test_where_random_play_finds_nothing_td3_and_ddpg_get_wider_pink_noise(algo: str) -> None:
    every_step = {"hyperparameters.policy_delay": 1} if algo == "td3" else {}
    assert keys(algo, NOTHING_FOUND) == {
        "hyperparameters.action_noise_color": adapt.PINK_NOISE,
        "hyperparameters.action_noise": adapt.WIDE_ACTION_NOISE,
        **every_step,
    }
    preset = {"hyperparameters": {"action_noise_color": 2.0, "action_noise": 0.6}}
    assert keys(algo, NOTHING_FOUND, preset) == every_step


def test_where_random_play_finds_nothing_td3s_actor_steps_with_every_critic_step() -> None:
    reasons = {a.key: a.reason for a in adaptations(get_algorithm("td3"), NOTHING_FOUND, {})}
    assert "instead of every 2," in reasons["hyperparameters.policy_delay"]
    preset = {"hyperparameters": {"policy_delay": 1}}
    assert "hyperparameters.policy_delay" not in keys("td3", NOTHING_FOUND, preset)
    found = replace(NOTHING_FOUND, reward_max=0.5)
    assert "hyperparameters.policy_delay" not in keys("td3", found)


@pytest.mark.parametrize(
    "found",
    [
        {"reached_terminal": True, "truncated_share": 0.5},  # a terminal state was reached
        {"reward_max": 0.5},  # some step earned something
        {"episodes": 0, "mean_episode_length": None},  # no episode ended in the probe
        # Doing nothing costs too (Pendulum: -1343 over its 200 steps): the cost follows the
        # state, a shaped reward random play measured, not only the action's effort.
        {"zero_action_return": -1343.0, "zero_action_truncated": True},
        # ... and doing nothing that pays is something found.
        {"zero_action_return": 5.0, "zero_action_truncated": True},
    ],
)
def test_pink_noise_only_where_random_play_finds_nothing(found: dict[str, Any]) -> None:
    assert keys("sac", replace(NOTHING_FOUND, **found)) == {}
    assert keys("td3", replace(NOTHING_FOUND, **found)) == {}
    assert "hyperparameters.action_noise_color" not in keys("ppo", replace(NOTHING_FOUND, **found))
    assert keys("sac", replace(NOTHING_FOUND, action_kind="discrete")) == {}


CALM = replace(
    PLAIN,
    action_kind="continuous",
    episode_return_mean=-54.0,
    episode_return_std=93.0,
    zero_action_return=993.0,
    zero_action_truncated=True,
)
"""Ant-v5 under the probe: doing nothing stands to the time limit and returns far more than
random play, whose noise knocks the stance over and pays the control cost."""


@pytest.mark.parametrize("algo", ["ppo", "a2c", "trpo", "appo", "impala"])
def test_where_doing_nothing_beats_random_play_the_gaussian_policy_starts_calmer(
    algo: str,
) -> None:
    assert keys(algo, CALM) == {"hyperparameters.log_std_init": adapt.CALM_LOG_STD}
    reasons = {a.key: a.reason for a in adaptations(get_algorithm(algo), CALM, {})}
    assert "returns 993, random play -54" in reasons["hyperparameters.log_std_init"]
    # A preset that starts calmer already keeps its value.
    assert keys(algo, CALM, {"hyperparameters": {"log_std_init": -2.0}}) == {}


@pytest.mark.parametrize(
    "change",
    [
        {"zero_action_truncated": False},  # doing nothing ends the episode too (a fall)
        {"zero_action_return": 200.0},  # within 3 standard deviations of random play
        {"zero_action_return": None},  # not measured
        {"episode_return_mean": None, "episode_return_std": None},  # no random episode ended
        {"action_kind": "discrete"},
        # Random play found nothing (MountainCarContinuous: doing nothing returns 0, 27 of
        # random play's standard deviations above it): its noise is what explores.
        {
            "reached_terminal": False,
            "reward_max": 0.0,
            "zero_action_return": 0.0,
            "episode_return_mean": -33.6,
            "episode_return_std": 1.2,
        },
    ],
)
def test_the_calmer_policy_only_where_doing_nothing_clearly_beats_random_play(
    change: dict[str, Any],
) -> None:
    assert "hyperparameters.log_std_init" not in keys("ppo", replace(CALM, **change))


@pytest.mark.parametrize("algo", ["sac", "td3", "ddpg", "dqn"])
def test_the_calmer_policy_is_not_for_off_policy_algorithms(algo: str) -> None:
    assert "hyperparameters.log_std_init" not in keys(algo, CALM)


def test_a_probed_env_where_doing_nothing_pays_gets_the_calmer_policy() -> None:
    stand = "tests.envs.test_probe:StandEnv"
    cfg = default_run_config(
        "ppo", stand, {"env": {"kwargs": {"max_episode_steps": 50}}}, adapt=True
    )
    assert cfg.hyperparameters.log_std_init == adapt.CALM_LOG_STD
    assert "doing nothing plays to the time limit and returns 50" in "\n".join(adapted_lines(cfg))
    for env_id in ("Pendulum-v1", "MountainCarContinuous-v0"):
        assert (
            "hyperparameters.log_std_init"
            not in default_run_config("ppo", env_id, adapt=True).adapted
        )


def test_the_probe_tells_a_cost_of_the_state_from_a_cost_of_the_action() -> None:
    # IMPALA has no preset for either env. MountainCarContinuous charges only the action's
    # effort, and gets pink noise; Pendulum charges the angle from upright whatever the
    # action, and does not (with pink noise IMPALA learnt to hold the pendulum down).
    climb = default_run_config("impala", "MountainCarContinuous-v0", adapt=True)
    assert climb.adapted.get("hyperparameters.action_noise_color") is not None
    swing = default_run_config("impala", "Pendulum-v1", adapt=True)
    assert "hyperparameters.action_noise_color" not in swing.adapted
    assert swing.hyperparameters.action_noise_color == 0.0


def test_an_unnamed_env_is_probed_and_each_value_has_a_reason() -> None:
    cfg = default_run_config("ppo", PENALTY, adapt=True)
    assert cfg.hyperparameters.normalize_obs is True
    assert cfg.hyperparameters.normalize_reward is True
    assert set(cfg.adapted) == {"hyperparameters.normalize_obs", "hyperparameters.normalize_reward"}
    lines = adapted_lines(cfg)
    assert len(lines) == 2
    assert lines[0].startswith(f"adapted to {PENALTY}: hyperparameters.normalize_obs = True (")
    # The rest is the preset's default section, as without adaptation.
    plain = default_run_config("ppo", PENALTY)
    assert plain.adapted == {}
    assert not plain.hyperparameters.normalize_obs
    assert replace(cfg.hyperparameters, normalize_obs=False, normalize_reward=False) == (
        plain.hyperparameters
    )


def test_a_setting_the_caller_gives_wins_and_is_not_recorded() -> None:
    cfg = default_run_config(
        "ppo", PENALTY, {"hyperparameters": {"normalize_obs": False}}, adapt=True
    )
    assert cfg.hyperparameters.normalize_obs is False
    assert cfg.hyperparameters.normalize_reward is True
    assert list(cfg.adapted) == ["hyperparameters.normalize_reward"]


def _no_probe(*_args: Any, **_kwargs: Any) -> Any:
    raise AssertionError("probed")


@pytest.mark.parametrize(
    ("algo", "env_id"),
    [("ppo", "CartPole-v1"), ("ppo", "MinAtar/Breakout-v1"), ("dqn", "CartPole-v1")],
)
def test_an_env_with_a_named_preset_is_never_probed(
    algo: str, env_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert has_named_preset(algo, env_id)
    monkeypatch.setattr(adapt, "probe_env", _no_probe)
    assert default_run_config(algo, env_id, adapt=True) == default_run_config(algo, env_id)


def test_off_switch_and_families_without_rules_do_not_probe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(adapt, "probe_env", _no_probe)
    off = default_run_config("ppo", PENALTY, {"adapt_defaults": False}, adapt=True)
    assert off.adapted == {}
    assert off.adapt_defaults is False
    assert off == default_run_config("ppo", PENALTY, {"adapt_defaults": False})
    assert adapted_preset(get_algorithm("bc"), "MountainCarContinuous-v0", {})[1] == {}
    assert default_run_config("ppo", PENALTY).adapted == {}  # adapt=False: the preset alone


def test_spaces_the_algorithm_refuses_are_refused_before_the_probe_plays(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # DQN on a Box action space: the refusal, not a rollout and adapted values before it.
    played: list[Any] = []
    monkeypatch.setattr(probe, "RolloutStats", lambda: played.append(1))
    with pytest.raises(EnvSpecError, match=r"^dqn does not support action space Box"):
        default_run_config("dqn", "Pendulum-v1", adapt=True)
    assert played == []


def test_the_record_round_trips_through_the_saved_config() -> None:
    cfg = default_run_config("ppo", PENALTY, adapt=True)
    data = run_config_to_dict(cfg)
    assert data["adapt_defaults"] is True
    assert data["adapted"] == cfg.adapted
    assert run_config_from_dict(data, "config.yaml") == cfg
