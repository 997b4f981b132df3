"""Defaults that adapt to an env the presets do not name.

The shipped presets (``rlfleet/config/presets/<algo>.yaml``) are tuned per env. An env with
no section of its own there (a glob section such as ``ALE/*`` counts as one) would get only
the ``default`` section, tuned for nothing. For such an env, :func:`adapted_preset` probes it
(:func:`rlfleet.envs.probe.probe_env`: a short, seeded random-policy rollout, and for Box
actions under a time limit two episodes of the zero action) and lays the
values of the rules below over the ``default`` section; settings the caller gives (a config
override, a command-line flag) are laid over both, so they always win:
preset ``default`` < adapted < the caller's.

Each rule reads the profile and gives a value with a one-line reason; a rule applies only to
algorithms whose config has the setting, and only where the caller left it unset. The rules
are written from what an env's profile says, never from its id:

- observation normalisation (on-policy and actor-learner algorithms, DQN): an observation
  entry whose spread under random play is far from unit scale (standard deviation under
  :data:`SMALL_OBS_STD` or over :data:`LARGE_OBS_STD`) gets lost next to the others in the
  first layer; and an unbounded observation space (MuJoCo's velocities and forces) has no
  scale fixed in advance, and its entries may grow far past random play's as the agent
  learns;
- reward normalisation (on-policy): a reward that is the same penalty (or zero) on almost
  every step (all but :data:`SPARSE_REWARD_SHARE`) gives returns whose scale follows the
  episode length rather than the task, and value targets far from unit scale; where
  random play found nothing to gain (no episode ended before its time limit, no reward
  above zero, and doing nothing, where it was played, returned nothing: random play paid
  only its actions' effort), the scale of what the task rewards is unknown; and where the
  observation space is unbounded, a reward that follows the observations (a speed, a
  distance) is unbounded too, and the returns of a trained agent are far from those of
  random play;
- a calmer Gaussian policy (on-policy and actor-learner algorithms, Box actions:
  ``log_std_init`` :data:`CALM_LOG_STD`, a standard deviation of about 0.37 instead of 1)
  where doing nothing plays to the time limit and returns more than random play by over
  :data:`CALM_MARGIN_STDS` standard deviations of random play's returns, and random play
  found something to gain (where it found nothing, the noise is what explores): the noise
  of the first policy is then what costs (a control cost, a stance it knocks over), and the
  first updates learn to end episodes sooner rather than to move (Ant-v5: zero action 994,
  random play -45; with the default spread, PPO, A2C, APPO, IMPALA and TRPO first learnt to
  fall over at 300k steps);
- colored exploration noise (on-policy, actor-learner and off-policy algorithms, Box
  actions): where random play found nothing to gain, the reward lies where independent
  per-step noise does not take the agent; pink noise (:data:`PINK_NOISE`,
  :mod:`rlfleet.nn.noise`) keeps a direction for longer and explores further; TD3 and
  DDPG, whose noise has a fixed scale, also take a wider one (:data:`WIDE_ACTION_NOISE`);
- SAC's discount reaches over the episode (``gamma`` :data:`LONG_HORIZON_GAMMA`, Box actions)
  where random play found nothing to gain and the time limit is longer than the discount's
  horizon, 1 / (1 - gamma): each step's reward is the action's cost and the goal's bonus
  comes at the end of a long episode, so a short horizon weighs reaching the goal a few
  steps sooner above the effort it costs, which the undiscounted return counts in full
  (measured on SAC only; TD3 and DDPG keep their discount);
- TD3's actor steps with every critic step (``policy_delay: 1``) where random play found
  nothing to gain: the first returns from the goal are rare, and the actor should follow
  them as soon as the critic has them, not every second critic step; the twin minimum still
  guards the critic against overestimation;
- DQN's warm-up (``learning_starts``): at least :data:`WARMUP_EPISODES` random episodes in
  the replay buffer before the first update, so early updates do not overfit one episode;
- DQN's target period: the target network follows the online one at least every
  :data:`TARGET_EPISODES` episodes' worth of env steps, since a value moves back about one
  step per target period and must cross whole episodes within the budget;
- DQN's n-step returns (:data:`SPARSE_N_STEP`) where the reward is uninformative, so the
  goal's value travels back that many steps per update;
- DQN's learning rate on vector observations (:data:`VECTOR_DQN_LEARNING_RATE`): the
  default is Nature DQN's, for a CNN on Atari frames;
- DQN's minibatch on vector observations (:data:`VECTOR_DQN_BATCH_SIZE`): the default (32)
  is Nature DQN's too; an update of a small MLP costs about the same at four times the
  samples (its time is operator dispatch, not arithmetic), and each update sees more of the
  replay buffer.

The run prints one line per adapted value with its reason, and ``config.yaml`` records the
values (so ``resume`` and ``play`` never probe again) with the reasons under ``adapted``.
``adapt_defaults: false`` (``--no-adapt-defaults``) turns adaptation off.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from rlfleet.algos.base import Algorithm
from rlfleet.config.loader import has_named_preset, merge, preset, validate
from rlfleet.envs.probe import EnvProfile, probe_env

SMALL_OBS_STD = 0.05
"""An observation entry whose standard deviation under random play is below this is badly
scaled (MountainCar's velocity: about 0.007)."""
LARGE_OBS_STD = 5.0
"""... and above this."""
SPARSE_REWARD_SHARE = 0.05
"""A reward that differs from its most common value (or from zero) on fewer steps than this
share is sparse."""
WARMUP_EPISODES = 5
"""Random episodes DQN's replay buffer holds before its first update."""
MAX_WARMUP_STEPS = 10_000
"""... at most this many steps."""
TARGET_EPISODES = 5
"""DQN's target network follows the online one at least every this many episodes."""
SPARSE_N_STEP = 3
"""DQN's n-step returns where the reward is uninformative."""
VECTOR_DQN_LEARNING_RATE = 2.5e-3
"""DQN's learning rate on vector observations, at least."""
VECTOR_DQN_BATCH_SIZE = 128
"""DQN's minibatch on vector observations, at least."""
CALM_LOG_STD = -1.0
"""``log_std_init`` of a Gaussian policy where random play's noise is what costs."""
CALM_MARGIN_STDS = 3.0
"""... that is, where the zero action's return exceeds random play's mean return by more than
this many standard deviations of random play's returns."""
NOTHING = 1e-6
"""A zero-action return within this of 0 is nothing (no cost, no reward)."""
PINK_NOISE = 1.0
"""``action_noise_color`` (the noise spectrum's exponent) where random play finds nothing."""
LONG_HORIZON_GAMMA = 0.999
"""SAC's ``gamma`` where random play finds nothing and the time limit is longer than the
horizon of the preset's discount."""
WIDE_ACTION_NOISE = 0.5
"""``action_noise`` of TD3 and DDPG (in units of half the action range) where random play
finds nothing."""


@dataclass(frozen=True)
class Adaptation:
    """One adapted setting: its dotted key in the run config, the value, and why."""

    key: str
    """``section.field``, e.g. ``hyperparameters.normalize_obs``."""
    value: Any
    reason: str


Rule = Callable[[EnvProfile, Any], Adaptation | None]
"""A rule: the profile and the algorithm's config as the preset sets it in, an adaptation
(or none) out."""


def _unbounded_vectors(profile: EnvProfile) -> bool:
    """Vector observations in a Box with an infinite bound (MuJoCo's)."""
    return profile.observation_kind == "vector" and not profile.observation_bounded


def _observation_normalisation(profile: EnvProfile, _hp: Any) -> Adaptation | None:
    spread = [s for s in profile.observation_std if s > 0.0]
    if profile.observation_kind != "vector" or not spread:
        return None
    low, high = min(spread), max(spread)
    if low < SMALL_OBS_STD or high > LARGE_OBS_STD:
        reason = (
            f"observation entries spread from {low:.2g} to {high:.2g} under random play, far "
            "from unit scale"
        )
    elif _unbounded_vectors(profile):
        reason = (
            "the observation space is unbounded: its entries have no scale fixed in advance, "
            "and may grow far past random play's as the agent learns"
        )
    else:
        return None
    return Adaptation("hyperparameters.normalize_obs", True, reason)


def _uninformative_reward(profile: EnvProfile) -> bool:
    """The reward is the same penalty (or zero) on almost every random step: it tells
    nothing until the task is solved. A constant bonus for staying alive (CartPole) is
    informative: its returns measure how long the agent survives."""
    return (
        profile.steps > 0
        and profile.informative_reward_share < SPARSE_REWARD_SHARE
        and profile.most_common_reward <= 0.0
    )


def _nothing_found(profile: EnvProfile) -> bool:
    """Random play found nothing to gain: no episode reached a terminal state, no step's
    reward was above zero, and, where the zero action was played, doing nothing returned
    nothing either (within :data:`NOTHING`), so that every cost random play paid was its
    actions' effort (MountainCarContinuous: each step costs the action's effort, and the
    goal, whose bonus ends the episode, is never reached). What the task rewards lies where
    independent per-step noise does not go, at a scale the probe never saw. A cost that doing
    nothing pays too (Pendulum's angle from upright, Reacher's distance to its target)
    follows the state: random play measured a shaped reward, not nothing; and a reward for
    doing nothing is something found."""
    zero = profile.zero_action_return
    return (
        profile.episodes > 0
        and not profile.reached_terminal
        and profile.reward_max <= 0.0
        and (zero is None or abs(zero) <= NOTHING)
    )


def _nothing_found_reason(profile: EnvProfile) -> str:
    """What :func:`_nothing_found` read from the profile, to begin a rule's reason."""
    idle = "" if profile.zero_action_return is None else ", and doing nothing returned 0"
    return (
        "random play never ended an episode before its time limit and never earned a reward "
        f"above {profile.reward_max:g}{idle}"
    )


def _follows_unbounded_observations(profile: EnvProfile) -> bool:
    """The observation space is unbounded and the reward varies from step to step (not a
    constant bonus for staying alive, as CartPole's): a speed or a distance the reward
    measures can grow without a bound the probe could see."""
    return _unbounded_vectors(profile) and profile.informative_reward_share >= SPARSE_REWARD_SHARE


def _reward_normalisation(profile: EnvProfile, _hp: Any) -> Adaptation | None:
    if _uninformative_reward(profile):
        reason = (
            f"the reward is {profile.most_common_reward:g} on "
            f"{profile.reward_constant_share:.0%} of random steps: returns scale with "
            "episode length"
        )
    elif _nothing_found(profile):
        reason = f"{_nothing_found_reason(profile)}: the scale of what the task rewards is unknown"
    elif _follows_unbounded_observations(profile):
        reason = (
            "the observation space is unbounded and the reward varies from step to step: a "
            "reward that follows the observations is unbounded too, and a trained agent's "
            "returns are far from random play's"
        )
    else:
        return None
    return Adaptation("hyperparameters.normalize_reward", True, reason)


def _calm_policy(profile: EnvProfile, hp: Any) -> Adaptation | None:
    zero, mean, std = (
        profile.zero_action_return,
        profile.episode_return_mean,
        profile.episode_return_std,
    )
    if (
        profile.action_kind != "continuous"
        or not profile.zero_action_truncated
        or zero is None
        or mean is None
        or std is None
        or zero - mean <= CALM_MARGIN_STDS * std
        or _nothing_found(profile)
        or getattr(hp, "log_std_init", CALM_LOG_STD) <= CALM_LOG_STD
    ):
        return None
    return Adaptation(
        "hyperparameters.log_std_init",
        CALM_LOG_STD,
        f"doing nothing plays to the time limit and returns {zero:.3g}, random play "
        f"{mean:.3g} (standard deviation {std:.2g}): the first policy's noise is what costs, "
        f"so it starts at a standard deviation of e^{CALM_LOG_STD:g} instead of "
        f"e^{hp.log_std_init:g}",
    )


def _colored_noise(profile: EnvProfile, hp: Any) -> Adaptation | None:
    if (
        profile.action_kind != "continuous"
        or not _nothing_found(profile)
        or getattr(hp, "action_noise_color", PINK_NOISE) >= PINK_NOISE
    ):
        return None
    return Adaptation(
        "hyperparameters.action_noise_color",
        PINK_NOISE,
        f"{_nothing_found_reason(profile)}: pink noise keeps a direction for longer and "
        "explores further than independent noise",
    )


def _dqn_warmup(profile: EnvProfile, hp: Any) -> Adaptation | None:
    if profile.mean_episode_length is None:
        return None
    steps = min(round(WARMUP_EPISODES * profile.mean_episode_length), MAX_WARMUP_STEPS)
    if hp.learning_starts >= steps:
        return None
    return Adaptation(
        "hyperparameters.learning_starts",
        steps,
        f"{WARMUP_EPISODES} random episodes of {profile.mean_episode_length:.0f} steps before "
        "the first update",
    )


def _dqn_target_period(profile: EnvProfile, hp: Any) -> Adaptation | None:
    if profile.mean_episode_length is None or hp.gradient_steps == 0:
        return None
    env_steps = TARGET_EPISODES * profile.mean_episode_length
    interval = max(round(env_steps * hp.gradient_steps / hp.train_freq), 1)
    if interval >= hp.target_update_interval:
        return None
    return Adaptation(
        "hyperparameters.target_update_interval",
        interval,
        f"the target network follows every {TARGET_EPISODES} episodes ({env_steps:.0f} env "
        "steps): a value moves back one step per target period",
    )


def _dqn_n_step(profile: EnvProfile, hp: Any) -> Adaptation | None:
    if not _uninformative_reward(profile) or hp.n_step >= SPARSE_N_STEP:
        return None
    return Adaptation(
        "hyperparameters.n_step",
        SPARSE_N_STEP,
        f"the reward is {profile.most_common_reward:g} on "
        f"{profile.reward_constant_share:.0%} of random steps: {SPARSE_N_STEP}-step returns "
        "carry the goal's value back faster",
    )


def _vector_dqn_floor(name: str, floor: float, why: str) -> Rule:
    """A rule that raises DQN's ``name`` to ``floor`` on vector observations, where the
    preset's value is below it; ``why`` follows "vector observations: <value> is"."""

    def rule(profile: EnvProfile, hp: Any) -> Adaptation | None:
        value = getattr(hp, name)
        if profile.observation_kind != "vector" or value >= floor:
            return None
        return Adaptation(
            f"hyperparameters.{name}", floor, f"vector observations: {value:g} is {why}"
        )

    return rule


_dqn_learning_rate = _vector_dqn_floor(
    "learning_rate", VECTOR_DQN_LEARNING_RATE, "the rate of a CNN on Atari frames"
)
_dqn_batch_size = _vector_dqn_floor(
    "batch_size",
    VECTOR_DQN_BATCH_SIZE,
    "the minibatch of a CNN on Atari frames; an MLP's update costs about the same at "
    f"{VECTOR_DQN_BATCH_SIZE}",
)


def _every_step_actor(profile: EnvProfile, hp: Any) -> Adaptation | None:
    if (
        profile.action_kind != "continuous"
        or not _nothing_found(profile)
        or getattr(hp, "policy_delay", 1) <= 1
    ):
        return None
    return Adaptation(
        "hyperparameters.policy_delay",
        1,
        f"{_nothing_found_reason(profile)}: the actor steps with every critic step instead of "
        f"every {hp.policy_delay}, and follows the first returns from the goal as soon as the "
        "critic has them",
    )


def _long_horizon(profile: EnvProfile, hp: Any) -> Adaptation | None:
    limit = profile.max_episode_steps
    if (
        profile.action_kind != "continuous"
        or not _nothing_found(profile)
        or limit is None
        or hp.gamma >= LONG_HORIZON_GAMMA
    ):
        return None
    horizon = round(1.0 / (1.0 - hp.gamma))  # rounded: 1 / (1 - 0.99) is 99.99999...
    if horizon >= limit:
        return None
    return Adaptation(
        "hyperparameters.gamma",
        LONG_HORIZON_GAMMA,
        f"{_nothing_found_reason(profile)}: a discount of {hp.gamma:g} looks {horizon} steps "
        f"ahead, less than the time limit of {limit} steps, and weighs reaching the goal "
        "sooner above the effort it costs",
    )


def _wide_action_noise(profile: EnvProfile, hp: Any) -> Adaptation | None:
    if (
        profile.action_kind != "continuous"
        or not _nothing_found(profile)
        or getattr(hp, "action_noise", WIDE_ACTION_NOISE) >= WIDE_ACTION_NOISE
    ):
        return None
    return Adaptation(
        "hyperparameters.action_noise",
        WIDE_ACTION_NOISE,
        f"{_nothing_found_reason(profile)}: exploration noise of a quarter of the action range "
        f"({WIDE_ACTION_NOISE:g} of its half) reaches further than {hp.action_noise:g}",
    )


RULES: dict[str, tuple[Rule, ...]] = {
    "on_policy": (
        _observation_normalisation,
        _reward_normalisation,
        _calm_policy,
        _colored_noise,
    ),
    "actor_learner": (_observation_normalisation, _calm_policy, _colored_noise),
    "off_policy": (_colored_noise, _wide_action_noise, _every_step_actor),
    "sac": (_colored_noise, _long_horizon),
    "dqn": (
        _observation_normalisation,
        _dqn_warmup,
        _dqn_target_period,
        _dqn_n_step,
        _dqn_learning_rate,
        _dqn_batch_size,
    ),
}
"""The rules per algorithm family (see :func:`family`)."""


def family(algo: type[Algorithm[Any]]) -> str | None:
    """The rule family of ``algo``: ``on_policy`` (PPO, A2C, TRPO, ...), ``actor_learner``
    (APPO, IMPALA), ``dqn``, ``sac``, ``off_policy`` (TD3, DDPG), or None (offline
    algorithms: no rules)."""
    if algo.kind == "on_policy":
        return "on_policy"
    if algo.kind == "distributed":
        return "actor_learner"
    if algo.kind == "off_policy":
        return algo.name if algo.name in ("dqn", "sac") else "off_policy"
    return None


def adaptations(
    algo: type[Algorithm[Any]], profile: EnvProfile, base: Mapping[str, Any]
) -> list[Adaptation]:
    """What the rules of ``algo``'s family give for ``profile``, over the preset ``base``,
    limited to settings ``algo``'s config has."""
    name = family(algo)
    if name is None:
        return []
    known = {f"hyperparameters.{f.name}" for f in fields(algo.config_class)}
    hp = validate(algo.config_class, base.get("hyperparameters") or {}, f"{algo.name} preset")
    found = (rule(profile, hp) for rule in RULES[name])
    return [a for a in found if a is not None and a.key in known]


def adapted_preset(
    algo: type[Algorithm[Any]],
    env_id: str,
    overrides: Mapping[str, Any],
    *,
    env_kwargs: Mapping[str, Any] | None = None,
    profile: EnvProfile | None = None,
) -> tuple[dict[str, Any], dict[str, str]]:
    """The shipped preset for ``algo`` on ``env_id`` and, when adaptation applies, the
    adapted values laid over it (see the module docstring), with the record of what was
    adapted and why (dotted key -> reason).

    Adaptation applies when the presets do not name the env, ``overrides`` do not set
    ``adapt_defaults`` false, and the env is a single-agent one; a setting ``overrides``
    give is not adapted (the caller lays ``overrides`` over the result). ``profile``: the
    env's probe when the caller has it already (else the env is probed here).
    """
    base = preset(algo.name, env_id)
    if (
        not overrides.get("adapt_defaults", True)
        or has_named_preset(algo.name, env_id)
        or family(algo) is None
        or env_id.startswith("pettingzoo:")
    ):
        return base, {}
    if profile is None:
        # The algorithm refuses spaces it cannot take before the probe's rollout, and so
        # before any adapted value is reported.
        profile = probe_env(
            env_id, env_kwargs=dict(env_kwargs or {}), check_spaces=algo.check_spaces
        )
    adapted: dict[str, Any] = {}
    record: dict[str, str] = {}
    for item in adaptations(algo, profile, base):
        if lookup(overrides, item.key) is not _UNSET:
            continue
        section, name = item.key.split(".", 1)
        adapted = merge(adapted, {section: {name: item.value}})
        record[item.key] = item.reason
    return merge(base, adapted), record


_UNSET = object()


def lookup(data: Any, key: str) -> Any:
    """The value at dotted ``key`` in a mapping or dataclass tree (``_UNSET`` when absent)."""
    for part in key.split("."):
        data = data.get(part, _UNSET) if isinstance(data, Mapping) else getattr(data, part, _UNSET)
        if data is _UNSET:
            return _UNSET
    return data


def adapted_lines(cfg: Any) -> list[str]:
    """One line per setting of the run config ``cfg`` adapted to its env: key, value, why."""
    return [
        f"adapted to {cfg.env.id}: {key} = {lookup(cfg, key)} ({why})"
        for key, why in cfg.adapted.items()
    ]


def still_adapted(record: Mapping[str, str], base: Any, laid: Any) -> dict[str, str]:
    """The entries of ``record`` (adapted in ``base``) whose value ``laid`` keeps: a setting
    the caller changed on top is the caller's, no longer adapted."""
    return {key: why for key, why in record.items() if lookup(base, key) == lookup(laid, key)}
