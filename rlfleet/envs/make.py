"""Building environments: one env for playing, a vector env for training.

Every vector env rlfleet builds uses Gymnasium's next-step autoreset
(:attr:`gymnasium.vector.AutoresetMode.NEXT_STEP`, the default and the only mode
Gymnasium's native vector entry points such as ``CartPoleVectorEnv`` offer): the step
that ends an episode returns the *final* observation with ``terminated`` or
``truncated`` set, and the next step of that sub-env ignores its action and returns the
first observation of the new episode with reward 0. Collectors mark that reset step
invalid. Because the final observation is returned as a regular observation, a truncated
episode bootstraps from the value of its true final observation, not from the reset one.

An env that fails raises :class:`~rlfleet.errors.EnvWorkerError` in every mode: ``async``
workers (:mod:`rlfleet.envs.workers`) report deaths, exceptions and hangs and can restart
a failed env; in-process envs are wrapped (:mod:`rlfleet.envs.faults`) so that an
exception names the env index where it is known and the step.

Atari (ALE) ids get the standard preprocessing of :mod:`rlfleet.envs.atari` by default
(an :class:`~rlfleet.envs.atari.AtariConfig` selects or disables it); their ids are
registered on first use when ale-py is installed, and so are MinAtar's ids
(:mod:`rlfleet.envs.minatar`) when minatar is.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import os
import re
from collections.abc import Callable
from types import ModuleType
from typing import Any, Literal, TypeVar

import gymnasium as gym
from gymnasium.envs.registration import EnvSpec
from gymnasium.vector import AutoresetMode, VectorEnv

from rlfleet.config.loader import validate
from rlfleet.envs.atari import (
    AtariConfig,
    is_atari,
    make_atari_env,
    make_native_vec_env,
    register_atari_envs,
    require_ale,
)
from rlfleet.envs.envpool import EnvPoolVectorEnv, check_envpool_env
from rlfleet.envs.faults import EnvFaultWrapper, VectorEnvFaultWrapper
from rlfleet.envs.minatar import is_minatar_id, register_minatar_envs
from rlfleet.envs.workers import WorkerVectorEnv
from rlfleet.errors import EnvSpecError

VectorMode = Literal["auto", "native", "sync", "async", "envpool"]
EnvT = TypeVar("EnvT")
VECTOR_MODES: tuple[str, ...] = ("auto", "native", "sync", "async", "envpool")


def env_spec(env_id: str) -> EnvSpec:
    """Resolve an env id, in any form rlfleet accepts, to the Gymnasium spec that builds it.

    - ``CartPole-v1``: a registered id (ale-py's Atari ids and minatar's ``MinAtar/...`` ids
      are registered on first use);
    - ``package.module:EnvId``: the module registers ``EnvId`` when it is imported;
    - ``package.module:EnvClass``: a :class:`gymnasium.Env` subclass (or a function that
      returns an env) defined in the module; it is built with the env kwargs, has no
      native vector entry point, and its spec's id is the whole string.

    Every command that takes an env (``train``, ``check-env``, ``play``, ``eval``, ...)
    resolves it here, so they all accept the same forms. Unknown ids suggest close matches.
    """
    if ":" not in env_id:
        return _registered_spec(env_id)
    module_name, _, name = env_id.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise EnvSpecError(
            f"cannot import module {module_name!r} named in env id {env_id!r}: {err}"
        ) from err
    if name in gym.registry:
        return gym.spec(name)
    entry = getattr(module, name, None)
    if entry is None:
        offered = _envs_of_module(module_name, module)
        close = difflib.get_close_matches(name, offered, n=5, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise EnvSpecError(
            f"{env_id!r}: module {module_name!r} neither registers the env id {name!r} nor "
            f"defines {name!r}{hint} (expected 'module:EnvId' for an id the module registers "
            "on import, or 'module:EnvClass' for a gymnasium.Env subclass in it)"
        )
    if not callable(entry):
        raise EnvSpecError(
            f"{env_id!r}: {name!r} in {module_name!r} is a {type(entry).__name__}, expected a "
            "gymnasium.Env subclass, a function returning an env, or an env id it registers"
        )
    return EnvSpec(id=env_id, entry_point=entry)


def _registered_spec(env_id: str) -> EnvSpec:
    try:
        return gym.spec(env_id)
    except gym.error.Error as err:
        if env_id.startswith("ALE/"):
            require_ale(env_id)
        if is_minatar_id(env_id):
            register_minatar_envs(env_id)
            if env_id in gym.registry:
                return gym.spec(env_id)
        if register_atari_envs() and env_id in gym.registry:
            return gym.spec(env_id)
        known = sorted(gym.registry.keys())
        close = difflib.get_close_matches(env_id, known, n=5, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise EnvSpecError(
            f"unknown environment id {env_id!r}{hint} (a registered Gymnasium id such as "
            f"'CartPole-v1', 'module:EnvId' to import the module that registers it, or "
            f"'module:EnvClass' for a gymnasium.Env subclass)"
        ) from err


def _envs_of_module(module_name: str, module: ModuleType) -> list[str]:
    """The env ids a module registered and the env classes it defines (for suggestions)."""
    ids = [
        spec.id
        for spec in gym.registry.values()
        if str(spec.entry_point).startswith(f"{module_name}:")
        or getattr(spec.entry_point, "__module__", None) == module_name
    ]
    classes = [
        attr
        for attr, value in vars(module).items()
        if isinstance(value, type) and issubclass(value, gym.Env)
    ]
    return ids + classes


def _checked_atari(atari: AtariConfig | None, default: AtariConfig) -> AtariConfig:
    """``atari`` checked as a run config's Atari settings are (None: ``default``)."""
    return default if atari is None else validate(AtariConfig, atari, "AtariConfig")


def make_env(
    env_id: str,
    *,
    render_mode: str | None = None,
    atari: AtariConfig | None = None,
    **kwargs: Any,
) -> gym.Env[Any, Any]:
    """Create one environment: ``"CartPole-v1"``, ``"package.module:EnvId"`` or
    ``"package.module:EnvClass"`` (see :func:`env_spec`).

    An Atari id gets ``atari``'s preprocessing, by default the evaluation setting (whole
    games, raw rewards): this is the env ``rlfleet play`` shows.
    """
    spec = env_spec(env_id)
    if is_atari(spec):
        config = _checked_atari(atari, AtariConfig().for_evaluation())
        return _construct(
            env_id, kwargs, lambda: make_atari_env(spec, config, render_mode=render_mode, **kwargs)
        )
    if render_mode is not None:
        # Only when asked: an env class without a render_mode parameter still plays.
        kwargs["render_mode"] = render_mode
    return _construct(env_id, kwargs, lambda: gym.make(spec, **kwargs))


def choose_vector_mode(env_id: str, num_envs: int) -> Literal["native", "sync", "async"]:
    """Pick the fastest vectorisation for an env id.

    The env's own vectorised entry point wins where it exists (no Python loop over envs),
    for more than one env. Otherwise sync: on a machine with few cores, subprocess workers
    cost a pipe round trip (~0.15 ms) per step, which only pays off when one env step costs
    far more than that;
    ``rlfleet check-env`` measures the step time and recommends ``async`` where it helps.
    """
    spec = env_spec(env_id)
    # With one env there is no loop to save, and the native entry points' batched numpy code
    # costs more per step than the plain env (measured: CartPole 2x slower).
    if spec.vector_entry_point is not None and num_envs > 1:
        return "native"
    if num_envs > 1 and (os.cpu_count() or 1) > 2 and spec.entry_point is not None:
        # Heavy simulators (MuJoCo, Atari) gain from processes once there are cores to spare.
        entry = str(spec.entry_point)
        if "mujoco" in entry or "ale_py" in entry:
            return "async"
    return "sync"


def make_vec_env(
    env_id: str,
    num_envs: int = 1,
    seed: int | None = None,
    mode: VectorMode = "auto",
    *,
    env_kwargs: dict[str, Any] | None = None,
    wrappers: list[Callable[[gym.Env[Any, Any]], gym.Env[Any, Any]]] | None = None,
    step_timeout_s: float = 60.0,
    restart_failed_envs: bool = False,
    atari: AtariConfig | None = None,
) -> VectorEnv[Any, Any, Any]:
    """Create ``num_envs`` copies of an env as one next-step-autoreset vector env.

    Args:
        env_id: a registered id, ``"module:EnvId"`` or ``"module:EnvClass"`` (see
            :func:`env_spec`).
        num_envs: number of sub-environments.
        seed: if given, the vector env is reset once with ``seed`` (sub-env ``i`` gets
            ``seed + i``) so the first observations are reproducible.
        mode: ``"native"`` (the env's vectorised entry point), ``"sync"`` (in-process loop),
            ``"async"`` (shared-memory subprocess workers), ``"envpool"`` (EnvPool's C++
            envs, classic control only: see :mod:`rlfleet.envs.envpool`) or ``"auto"`` to
            choose (``"async"`` when ``restart_failed_envs`` is set; never ``"envpool"``).
        env_kwargs: keyword arguments for the env constructor.
        wrappers: single-env wrappers applied to each sub-env (not with ``"native"``;
            refused with ``"envpool"``).
        step_timeout_s: ``"async"``: seconds a worker may take for one step or reset before
            it counts as hung (in-process envs cannot be interrupted).
        restart_failed_envs: ``"async"``: restart a worker that died, raised or hung and
            truncate its episode, instead of raising
            (see :class:`~rlfleet.envs.workers.WorkerVectorEnv`).
        atari: preprocessing of Atari ids (default: :class:`AtariConfig`'s training
            settings); the native mode of ``-v5`` ids is ale-py's C++ vector env with the
            same preprocessing.
    """
    if num_envs < 1:
        raise EnvSpecError(f"num_envs must be >= 1, got {num_envs}")
    if mode not in VECTOR_MODES:
        raise EnvSpecError(f"vector mode must be one of {VECTOR_MODES}, got {mode!r}")
    if mode == "envpool":
        check_envpool_env(env_id, env_kwargs or {})
    spec = env_spec(env_id)
    chosen: VectorMode
    if mode == "auto":
        # Only a process can be restarted after it failed.
        chosen = "async" if restart_failed_envs else choose_vector_mode(env_id, num_envs)
    else:
        chosen = mode
    if restart_failed_envs and chosen != "async":
        raise EnvSpecError(
            f"restart_failed_envs needs vector mode 'async' (subprocess workers) or 'auto', "
            f"got {mode!r}: an env in this process cannot be restarted after it failed"
        )
    if chosen == "envpool" and wrappers:
        raise EnvSpecError(
            f"vector mode 'envpool' steps {env_id!r} in C++ and cannot apply per-env wrappers "
            f"(got {len(wrappers)}; environment parameters need one); use vector mode 'sync'"
        )
    if chosen == "native" and wrappers:
        chosen = "sync"
    if chosen == "native" and spec.vector_entry_point is None:
        raise EnvSpecError(
            f"{env_id!r} has no native vectorised entry point; use mode 'sync' or 'async'"
        )
    kwargs = dict(env_kwargs or {})
    envs: VectorEnv[Any, Any, Any]
    atari_config = _checked_atari(atari, AtariConfig()) if is_atari(spec) else None
    if atari_config is not None and not atari_config.preprocess and chosen == "native":
        chosen = "sync"  # the native Atari vector env always preprocesses
    if chosen == "envpool":
        envs = VectorEnvFaultWrapper(EnvPoolVectorEnv(env_id, num_envs, kwargs))
    elif chosen == "native" and atari_config is not None:
        envs = VectorEnvFaultWrapper(
            _construct(
                env_id, kwargs, lambda: make_native_vec_env(spec, num_envs, atari_config, **kwargs)
            )
        )
    elif chosen == "native":
        envs = VectorEnvFaultWrapper(
            _construct(
                env_id,
                kwargs,
                lambda: gym.make_vec(
                    spec, num_envs=num_envs, vectorization_mode="vector_entry_point", **kwargs
                ),
            )
        )
    else:
        # The id as given, not the spec: a spawned worker resolves it again (importing its
        # module). A partial of a module-level function, not a closure, so workers unpickle it.
        thunk = functools.partial(_make_one, env_id, kwargs, tuple(wrappers or ()), atari_config)
        if chosen == "async":
            envs = WorkerVectorEnv(
                [thunk] * num_envs,
                step_timeout_s=step_timeout_s,
                restart_failed_envs=restart_failed_envs,
            )
        else:
            envs = gym.vector.SyncVectorEnv(
                [functools.partial(_with_fault_wrapper, thunk, i) for i in range(num_envs)],
                autoreset_mode=AutoresetMode.NEXT_STEP,
            )
    mode_found = envs.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
    if mode_found != AutoresetMode.NEXT_STEP:
        envs.close()
        raise EnvSpecError(
            f"{env_id!r}: vector env uses autoreset mode {mode_found}, rlfleet expects NEXT_STEP"
        )
    if seed is not None:
        envs.reset(seed=seed)
        envs.action_space.seed(seed)
    return envs


def _make_one(
    env_id: str,
    kwargs: dict[str, Any],
    wrappers: tuple[Callable[[gym.Env[Any, Any]], gym.Env[Any, Any]], ...],
    atari_config: AtariConfig | None,
) -> gym.Env[Any, Any]:
    spec = env_spec(env_id)
    if atari_config is None:
        env = _construct(env_id, kwargs, lambda: gym.make(spec, **kwargs))
    else:
        env = _construct(env_id, kwargs, lambda: make_atari_env(spec, atari_config, **kwargs))
    for wrap in wrappers:
        env = wrap(env)
    return env


def _construct(env_id: str, kwargs: dict[str, Any], build: Callable[[], EnvT]) -> EnvT:
    """Run an env constructor given the run's env kwargs: a TypeError there (an unknown or
    missing keyword argument) is bad input, reported as such, and so is a missing optional
    dependency of the env (Box2D, MuJoCo, ...), named with the extra that installs it."""
    try:
        return build()
    except gym.error.DependencyNotInstalled as err:
        raise EnvSpecError(missing_dependency_message(env_id, err)) from None
    except TypeError as err:
        if not kwargs:
            raise  # the env's own bug, not the run's input
        raise EnvSpecError(f"{env_id!r} cannot be built with env kwargs {kwargs}: {err}") from err


_EXTRA = re.compile(r"gymnasium\[([a-z0-9_-]+)\]")


def missing_dependency_message(env_id: str, err: Exception) -> str:
    """What to install for ``env_id``, from gymnasium's ``DependencyNotInstalled`` message
    (which names the ``gymnasium[extra]`` that provides it)."""
    found = _EXTRA.search(str(err))
    if found is None:
        return f"{env_id!r} needs a package that is not installed: {err}"
    extra = found.group(1)
    swig = " (Box2D builds with swig: `pip install swig` first)" if extra == "box2d" else ""
    return (
        f"{env_id!r} needs gymnasium's {extra!r} extra, which is not installed; install it "
        f'with `pip install "gymnasium[{extra}]"`{swig}'
    )


def _with_fault_wrapper(make: Callable[[], gym.Env[Any, Any]], index: int) -> gym.Env[Any, Any]:
    return EnvFaultWrapper(make(), index)
