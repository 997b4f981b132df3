"""The env doctor: does an environment keep the Gymnasium (or PettingZoo) contract?

``rlfleet check-env ENV_ID_OR_ENTRY_POINT`` and :func:`check_env` run the env on its own —
no wrappers that would hide API mistakes — and report errors (training would fail or be
wrong), warnings (training will work but probably poorly) and facts (measured step time,
the recommended vector mode and ``num_envs``).
"""

from __future__ import annotations

import importlib
import inspect
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.registration import EnvSpec

from rlfleet.envs.make import env_spec, missing_dependency_message
from rlfleet.envs.probe import RolloutStats
from rlfleet.envs.spaces import describe_space
from rlfleet.errors import EnvSpecError

Level = Literal["error", "warning", "info"]
PIPE_ROUND_TRIP_MS = 0.15
"""Cost of one step through a subprocess worker's pipe on this kind of machine."""


@dataclass(frozen=True)
class Finding:
    """One line of the report."""

    level: Level
    check: str
    message: str


@dataclass
class EnvReport:
    """What :func:`check_env` found."""

    target: str
    findings: list[Finding] = field(default_factory=list)
    step_time_ms: float | None = None
    recommended_mode: str | None = None
    recommended_num_envs: int | None = None

    @property
    def ok(self) -> bool:
        """No errors (warnings allowed)."""
        return not any(f.level == "error" for f in self.findings)

    def add(self, level: Level, check: str, message: str) -> None:
        self.findings.append(Finding(level, check, message))

    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "error"]

    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "warning"]


def load_env(target: str) -> tuple[Any, EnvSpec]:
    """The raw env for a registered id, ``module:EnvId`` or ``module:EnvClass``, and its spec.

    The target is resolved as every command resolves an env (:func:`rlfleet.envs.make.env_spec`),
    then built from its entry point without Gymnasium's wrappers, so the env's own API is what
    gets checked.
    """
    spec = env_spec(target)
    entry = spec.entry_point
    try:
        if isinstance(entry, str):
            module_name, _, attr = entry.partition(":")
            entry = getattr(importlib.import_module(module_name), attr)
        assert callable(entry)
        return entry(**spec.kwargs), spec
    except gym.error.DependencyNotInstalled as err:
        raise EnvSpecError(missing_dependency_message(target, err)) from None


def check_env(env: Any, *, num_steps: int = 2000, seed: int = 0) -> EnvReport:
    """Check an env (an instance, a registered id, ``module:EnvId`` or ``module:EnvClass``) and
    return the report."""
    target = env if isinstance(env, str) else type(env).__name__
    report = EnvReport(target=target)
    native = False
    if isinstance(env, str):
        try:
            env, spec = load_env(env)
            native = spec.vector_entry_point is not None
        except EnvSpecError as err:
            report.add("error", "load", str(err))
            return report
        except Exception as err:  # the env's own constructor failed: report, don't crash
            report.add("error", "load", f"creating the env raised {type(err).__name__}: {err}")
            return report
    try:
        if hasattr(env, "possible_agents"):
            _check_pettingzoo(env, report, num_steps, seed)
        else:
            _check_gymnasium(env, report, num_steps, seed, native)
    finally:
        close = getattr(env, "close", None)
        if callable(close):
            try:
                close()
            except Exception as err:
                report.add("warning", "close", f"close() raised {type(err).__name__}: {err}")
    return report


# ------------------------------------------------------------------ gymnasium
def _check_gymnasium(env: Any, report: EnvReport, num_steps: int, seed: int, native: bool) -> None:
    obs_space = getattr(env, "observation_space", None)
    act_space = getattr(env, "action_space", None)
    if not isinstance(obs_space, spaces.Space) or not isinstance(act_space, spaces.Space):
        report.add(
            "error",
            "spaces",
            "observation_space and action_space must be gymnasium.spaces.Space instances",
        )
        return
    report.add(
        "info",
        "spaces",
        f"observation {describe_space(obs_space)}, action {describe_space(act_space)}",
    )
    _check_space_bounds(obs_space, "observation", report)
    _check_space_bounds(act_space, "action", report)

    params = inspect.signature(env.reset).parameters
    if "seed" not in params or "options" not in params:
        report.add(
            "error", "reset signature",
            "reset() must accept keyword arguments seed and options: "
            "def reset(self, *, seed=None, options=None) -> tuple[obs, dict]; call "
            "super().reset(seed=seed) to seed self.np_random",
        )  # fmt: skip
        return
    first = _call(report, "reset", lambda: env.reset(seed=seed))
    if first is _FAILED:
        return
    if not (isinstance(first, tuple) and len(first) == 2 and isinstance(first[1], dict)):
        report.add(
            "error", "reset return",
            f"reset() returned {_kind(first)}; Gymnasium >= 1.0 expects (obs, info) — "
            "migration: return obs, {}",
        )  # fmt: skip
        return
    obs, _ = first
    _check_obs(obs_space, obs, report, "reset")
    again = _call(report, "reset", lambda: env.reset(seed=seed))
    if again is not _FAILED and isinstance(again, tuple) and not _same(obs, again[0]):
        report.add(
            "error", "seeding",
            f"reset(seed={seed}) twice gave different observations: reset ignores the seed "
            "(pass it to super().reset(seed=seed) and draw randomness from self.np_random)",
        )  # fmt: skip

    act_space.seed(seed)
    stats = RolloutStats()
    step_times: list[float] = []
    observations_ok = True
    for step in range(num_steps):
        action = act_space.sample()
        t0 = time.perf_counter()
        result = _call(report, f"step {step}", partial(env.step, action))
        step_times.append(time.perf_counter() - t0)
        if result is _FAILED:
            return
        if not isinstance(result, tuple) or len(result) != 5:
            if isinstance(result, tuple) and len(result) == 4:
                report.add(
                    "error", "step return",
                    "step() returned 4 values: the old Gym API (obs, reward, done, info). "
                    "Gymnasium >= 1.0 expects (obs, reward, terminated, truncated, info): "
                    "terminated for a true end of the task, truncated for a time limit",
                )  # fmt: skip
            else:
                report.add(
                    "error", "step return", f"step() returned {_kind(result)}, expected a 5-tuple"
                )
            return
        obs, reward, terminated, truncated, info = result
        if not _is_scalar_number(reward):
            report.add(
                "error",
                "reward",
                f"step {step}: reward must be a float scalar, got {_kind(reward)}",
            )
            return
        if not math.isfinite(float(reward)):
            report.add("error", "reward", f"step {step}: non-finite reward {reward}")
            return
        if not isinstance(terminated, bool | np.bool_) or not isinstance(
            truncated, bool | np.bool_
        ):
            report.add(
                "error", "step return",
                f"step {step}: terminated and truncated must be bools, got "
                f"{type(terminated).__name__} and {type(truncated).__name__}",
            )  # fmt: skip
            return
        if not isinstance(info, dict):
            report.add(
                "error", "step return", f"step {step}: info must be a dict, got {_kind(info)}"
            )
            return
        if observations_ok and not _check_obs(obs_space, obs, report, f"step {step}"):
            observations_ok = False
        numeric = isinstance(obs, np.ndarray) and np.issubdtype(obs.dtype, np.number)
        if numeric and not np.all(np.isfinite(obs)):
            report.add("error", "observation", f"step {step}: observation contains NaN or inf")
            return
        stats.add(obs, float(reward), bool(terminated), bool(truncated))
        if (terminated or truncated) and _call(report, "reset", lambda: env.reset()) is _FAILED:
            return
    report.add(
        "info",
        "rollout",
        f"{num_steps} random steps, {stats.episodes} episodes ended, no API errors",
    )
    _scale_warnings(report, np.asarray(stats.rewards), stats.obs_abs_max)
    _recommend(report, float(np.median(step_times)) * 1e3, native)


def _check_space_bounds(space: spaces.Space[Any], label: str, report: EnvReport) -> None:
    if isinstance(space, spaces.Dict):
        for key, sub in space.spaces.items():
            _check_space_bounds(sub, f"{label}[{key!r}]", report)
        return
    if not isinstance(space, spaces.Box):
        return
    if np.any(np.isnan(space.low)) or np.any(np.isnan(space.high)):
        report.add("error", "bounds", f"{label} Box bounds contain NaN")
    elif np.any(space.low > space.high):
        report.add("error", "bounds", f"{label} Box has low > high")
    elif label == "action" and not (
        np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))
    ):
        report.add(
            "error",
            "bounds",
            "action Box has infinite bounds; declare the real limits so actions can be "
            "clipped and scaled",
        )
    elif label == "action" and (
        np.any(np.abs(space.low) > 1e3) or np.any(np.abs(space.high) > 1e3)
    ):
        report.add(
            "warning",
            "bounds",
            "action Box bounds are very wide; policies sample near 0 — consider rescaling "
            "actions to [-1, 1]",
        )


def _check_obs(space: spaces.Space[Any], obs: Any, report: EnvReport, where: str) -> bool:
    if space.contains(obs):
        return True
    if isinstance(space, spaces.Box) and isinstance(obs, np.ndarray):
        if obs.shape != space.shape:
            detail = f"shape {obs.shape}, declared {space.shape}"
        elif obs.dtype != space.dtype:
            detail = (
                f"dtype {obs.dtype}, declared {space.dtype} (return obs.astype(np.{space.dtype}))"
            )
        else:
            detail = "values outside the declared bounds"
        report.add(
            "error", "observation", f"{where}: observation not in observation_space: {detail}"
        )
    else:
        report.add(
            "error",
            "observation",
            f"{where}: observation {_kind(obs)} is not in {describe_space(space)}",
        )
    return False


def _scale_warnings(report: EnvReport, rewards: np.ndarray, obs_abs_max: float) -> None:
    if rewards.size and float(np.abs(rewards).max()) > 100:
        report.add(
            "warning", "reward scale",
            f"rewards reach {float(np.abs(rewards).max()):.3g} in magnitude; value losses will be "
            "large — consider reward scaling or normalisation",
        )  # fmt: skip
    if obs_abs_max > 100:
        report.add(
            "warning", "observation scale",
            f"observations reach {obs_abs_max:.3g} in magnitude; consider normalize_obs",
        )  # fmt: skip


def _recommend(report: EnvReport, step_ms: float, native: bool) -> None:
    report.step_time_ms = step_ms
    cores = os.cpu_count() or 1
    if native:
        report.recommended_mode = "native"
        report.recommended_num_envs = 8
        why = "the env has its own vectorised implementation: no Python loop over envs"
    elif step_ms > 10 * PIPE_ROUND_TRIP_MS and cores > 1:
        report.recommended_mode = "async"
        report.recommended_num_envs = 2 * cores
        why = "one step costs far more than a pipe round trip, so subprocess workers pay off"
    else:
        report.recommended_mode = "sync"
        report.recommended_num_envs = 8
        why = (
            f"a step is cheap next to a subprocess round trip (~{PIPE_ROUND_TRIP_MS} ms); stepping "
            "envs in-process is faster"
        )
    report.add(
        "info", "speed",
        f"median step {step_ms:.3f} ms ({1e3 / max(step_ms, 1e-6):,.0f} steps/s): use "
        f"vector_mode={report.recommended_mode}, num_envs={report.recommended_num_envs} — {why}",
    )  # fmt: skip


# ------------------------------------------------------------------ pettingzoo
def _check_pettingzoo(env: Any, report: EnvReport, num_steps: int, seed: int) -> None:
    agents = list(env.possible_agents)
    if not agents:
        report.add("error", "agents", "possible_agents is empty")
        return
    for agent in agents:
        for name in ("observation_space", "action_space"):
            space = _call(
                report,
                f"{name}({agent!r})",
                partial(getattr(env, name), agent),
            )
            if space is _FAILED:
                return
            if not isinstance(space, spaces.Space):
                report.add("error", "spaces", f"{name}({agent!r}) did not return a gymnasium Space")
                return
    parallel = not hasattr(env, "agent_iter")
    report.add(
        "info", "api", f"PettingZoo {'Parallel' if parallel else 'AEC'} env with agents {agents}"
    )
    first = _call(report, "reset", lambda: env.reset(seed=seed))
    if parallel:
        if not (isinstance(first, tuple) and len(first) == 2 and isinstance(first[0], dict)):
            report.add(
                "error",
                "reset return",
                f"reset() returned {_kind(first)}; expected (observations, infos) dicts",
            )
            return
        _parallel_rollout(env, report, num_steps, first[0])
    else:
        _aec_rollout(env, report, num_steps)


def _parallel_rollout(
    env: Any, report: EnvReport, num_steps: int, observations: dict[str, Any]
) -> None:
    for step in range(num_steps):
        for agent, obs in observations.items():
            if not env.observation_space(agent).contains(obs):
                report.add(
                    "error",
                    "observation",
                    f"step {step}: {agent}'s observation is not in its space",
                )
                return
        if not env.agents:
            break
        actions = {agent: env.action_space(agent).sample() for agent in env.agents}
        result = _call(report, f"step {step}", partial(env.step, actions))
        if not (isinstance(result, tuple) and len(result) == 5):
            report.add("error", "step return", f"step() returned {_kind(result)}; expected 5 dicts")
            return
        observations, rewards, terminations, truncations, _ = result
        for agent, reward in rewards.items():
            if not _is_scalar_number(reward) or not math.isfinite(float(reward)):
                report.add(
                    "error",
                    "reward",
                    f"step {step}: {agent}'s reward {reward!r} is not a finite scalar",
                )
                return
        if all(terminations.get(a, False) or truncations.get(a, False) for a in rewards):
            observations, _ = env.reset()
    report.add("info", "rollout", f"{num_steps} random parallel steps, no API errors")


def _aec_rollout(env: Any, report: EnvReport, num_steps: int) -> None:
    for step, agent in enumerate(env.agent_iter(max_iter=num_steps)):
        result = _call(report, "last", lambda: env.last())
        if not (isinstance(result, tuple) and len(result) == 5):
            report.add(
                "error", "last return", f"last() returned {_kind(result)}; expected a 5-tuple"
            )
            return
        obs, reward, terminated, truncated, _ = result
        if not _is_scalar_number(reward) or not math.isfinite(float(reward)):
            report.add(
                "error",
                "reward",
                f"turn {step}: {agent}'s reward {reward!r} is not a finite scalar",
            )
            return
        space = env.action_space(agent)
        mask = (
            (obs.get("action_mask") if isinstance(obs, dict) else None) if obs is not None else None
        )
        if terminated or truncated:
            action = None
        elif mask is not None and np.any(mask):
            action = int(np.flatnonzero(mask)[0])
        else:
            action = space.sample()
        if _call(report, f"step (turn {step})", partial(env.step, action)) is _FAILED:
            return
    report.add("info", "rollout", f"{num_steps} random AEC turns, no API errors")


# ------------------------------------------------------------------ helpers
_FAILED = object()


def _call(report: EnvReport, what: str, fn: Callable[[], Any]) -> Any:
    """``fn()``, or ``_FAILED`` after reporting the exception it raised."""
    try:
        return fn()
    except Exception as err:
        report.add("error", what, f"{what} raised {type(err).__name__}: {err}")
        return _FAILED


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(np.array_equal(np.asarray(a), np.asarray(b)))


def _is_scalar_number(value: Any) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    if isinstance(value, tuple):
        return f"a tuple of {len(value)}"
    if isinstance(value, np.ndarray):
        return f"an array of shape {value.shape} and dtype {value.dtype}"
    return f"a {type(value).__name__}"
