"""What rbgame's ``DecentralizedTrainer`` form needs besides the loop: the env factory its
``env_args`` name (:func:`env_factory`) and the reward-metric plot (:func:`plot_reward_metric`).

The trainer itself is :class:`rlfleet.marl.trainer.DecentralizedTrainer`, which takes rbgame's
constructor and ``train`` call as they are documented (see ``docs/coming-from-rbgame.md``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from rlfleet.errors import ConfigError
from rlfleet.logging.plots import save_figure
from rlfleet.marl.agents import as_factory
from rlfleet.marl.envs import EnvFactory, is_pettingzoo_env, load_pettingzoo_factory

EnvArgs = Mapping[str, Any] | Callable[..., Any]
"""rbgame's ``env_args``: a mapping ``{"env": <factory>, **its keyword arguments}``, or a
factory that takes no arguments (a ``functools.partial`` of one with its keyword arguments)."""

ENV_KEY = "env"
"""The key of ``env_args`` that names the env factory; every other key is its argument."""

RESULTS_PLOT = Path("plots") / "results.png"
"""Where the reward-metric plot goes without a run directory (under the working directory,
as rbgame writes it)."""
RUN_DIR_PLOT = Path("plots") / "reward_metric.png"
"""Where the reward-metric plot goes in a run directory."""


def env_factory(env_args: EnvArgs) -> EnvFactory:
    """The factory of env copies that ``env_args`` names.

    A mapping holds the factory under ``env``: a PettingZoo env module path
    (``"pettingzoo.classic.tictactoe_v3"``, whose ``env()`` builds it;
    ``"module:parallel_env"`` picks another function), the module itself, or a callable;
    the mapping's other keys are its keyword arguments. Anything else must be a callable that
    builds the env without arguments, such as ``functools.partial(tictactoe_v3.env,
    render_mode=None)``, or a PettingZoo env (copied once per env copy).

    Raises:
        ConfigError: ``env_args`` is neither; the mapping has no ``env``; the factory does
            not take one of the keyword arguments.
        EnvSpecError: the module path does not name a PettingZoo env module.
    """
    if not isinstance(env_args, Mapping):
        if is_pettingzoo_env(env_args):
            return as_factory(env_args)
        if callable(env_args):
            _check_keywords(env_args, {})
            return env_args
        raise ConfigError(
            "env_args: expected a mapping {'env': <PettingZoo module path or factory>, "
            "**keyword arguments} or a callable that builds the env, got "
            f"{type(env_args).__name__}"
        )
    if ENV_KEY not in env_args:
        raise ConfigError(
            f"env_args: expected an {ENV_KEY!r} key naming the env factory (a PettingZoo module "
            f"path such as 'pettingzoo.classic.tictactoe_v3', or a callable), got keys "
            f"{sorted(map(str, env_args))}"
        )
    env = env_args[ENV_KEY]
    kwargs = {str(k): v for k, v in env_args.items() if k != ENV_KEY}
    factory: Callable[..., Any]
    if isinstance(env, str):
        factory = load_pettingzoo_factory(env)
    elif isinstance(env, ModuleType) and callable(getattr(env, "env", None)):
        factory = env.env
    elif callable(env):
        factory = env
    else:
        raise ConfigError(
            f"env_args[{ENV_KEY!r}]: expected a PettingZoo module path, module or callable, "
            f"got {type(env).__name__}"
        )
    _check_keywords(factory, kwargs)
    return functools.partial(factory, **kwargs)


def _check_keywords(factory: Callable[..., Any], kwargs: Mapping[str, Any]) -> None:
    """Refuse keyword arguments ``factory`` cannot take (factories that take ``**kwargs``, as
    PettingZoo's ``env()`` wrappers do, are checked when they build the env)."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin or C callable: nothing to check here
        return
    try:
        signature.bind(**kwargs)
    except TypeError as error:
        name = getattr(factory, "__qualname__", type(factory).__name__)
        raise ConfigError(
            f"env_args: expected keyword arguments that {name}{signature} takes, got "
            f"{sorted(kwargs)} ({error})"
        ) from None


def plot_reward_metric(episodes: Sequence[int], scores: Sequence[float], out: str | Path) -> Path:
    """Plot the reward metric of each test step against the training episodes before it
    (rbgame's ``plot``), written whole or not at all; returns ``out``."""
    # matplotlib is slow to import: only a run that plots pays for it.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4))
    axes = fig.add_subplot()
    axes.plot(list(episodes), list(scores), marker=".", color="b", label="reward metric")
    axes.set_xlabel("Number of collected episodes")
    axes.set_ylabel("Reward metric")
    axes.set_title("Reward metric of the test steps")
    axes.legend()
    axes.grid()
    return save_figure(fig, out, tight=True)
