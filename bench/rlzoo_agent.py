"""RL-Baselines3-Zoo's side of ``bench/zoo_rlzoo.py``: run by the interpreter where RL-Zoo
(``rl_zoo3``) is installed, never by rlfleet's. It imports neither rlfleet nor anything of
the bench, so that it runs in an environment of RL-Zoo's own pins.

    python bench/rlzoo_agent.py versions
    python bench/rlzoo_agent.py hyperparams ALGO:ENV [ALGO:ENV ...]
    python bench/rlzoo_agent.py evaluate ALGO ENV FOLDER --seeds 11,12,13 [--sampled]

Each command prints one line of JSON, last. ``versions`` prints the versions of RL-Zoo,
Stable-Baselines3 and torch, and those of the packages that build the envs (None where one
is not installed). ``hyperparams`` prints a list: for each pair, RL-Zoo's
hyperparameter set and where in RL-Zoo's ``hyperparams/ALGO.yml`` it is (:func:`hyperparams`),
or ``null`` where RL-Zoo has none (one process for every pair: RL-Zoo takes seconds to
import).

``evaluate`` loads the last model that ``python -m rl_zoo3.train ... -f FOLDER`` saved,
with its saved normalisation statistics and env wrappers (RL-Zoo's ``create_test_env``, as
its ``enjoy`` builds the env), plays one episode per seed of ``--seeds`` (each reset with
its seed) with greedy actions (``--sampled``: sampled ones), and prints their returns as a
JSON list. A return is the episode's undiscounted sum of the env's own rewards, read from
the ``Monitor`` wrapper that RL-Zoo puts under every other, so that no reward
normalisation or clipping enters it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

ENV_PACKAGES = ("gymnasium", "Box2D", "mujoco", "MinAtar", "ale-py")
"""The packages that build the benchmark's envs (``bench/zoo.py``'s ``SUITE_PACKAGES``)."""


def versions() -> dict[str, Any]:
    import rl_zoo3
    import stable_baselines3
    import torch

    packages: dict[str, str | None] = {}
    for package in ENV_PACKAGES:
        try:
            packages[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            packages[package] = None
    return {
        "rl_zoo3": rl_zoo3.__version__,
        "stable_baselines3": stable_baselines3.__version__,
        "torch": torch.__version__,
        "packages": packages,
    }


def hyperparams(algo: str, env_id: str) -> dict[str, Any] | None:
    """RL-Zoo's hyperparameter set for ``algo`` on ``env_id`` (``set``) and the key of
    ``hyperparams/ALGO.yml`` it is under (``source``): the env's own, else on an Atari env the
    ``atari`` set, as RL-Zoo's ``train`` picks it; else the set of the latest earlier version
    of the env (RL-Zoo tunes MuJoCo on ``Hopper-v4``, the zoo runs ``Hopper-v5``)."""
    import gymnasium as gym
    import rl_zoo3
    import rl_zoo3.import_envs  # registers the envs RL-Zoo trains on
    import yaml
    from rl_zoo3.exp_manager import ExperimentManager

    path = Path(rl_zoo3.__file__).parent / "hyperparams" / f"{algo}.yml"
    if not path.is_file():
        return None
    with open(path) as f:
        sets = yaml.safe_load(f)
    keys = [env_id]
    if env_id in gym.registry and ExperimentManager.is_atari(env_id):
        keys.append("atari")
    name, _, version = env_id.rpartition("-v")
    if version.isdigit():
        keys += [f"{name}-v{v}" for v in range(int(version) - 1, -1, -1)]
    source = next((key for key in keys if key in sets), None)
    return None if source is None else {"source": source, "set": dict(sets[source])}


def evaluate(algo: str, env_id: str, folder: str, seeds: list[int], sampled: bool) -> list[float]:
    """The return of one episode per seed of the model ``rl_zoo3.train`` left in ``folder``."""
    import numpy as np
    import rl_zoo3.import_envs  # noqa: F401 (registers the envs RL-Zoo trains on)
    from huggingface_sb3 import EnvironmentName
    from rl_zoo3 import ALGOS, create_test_env, get_saved_hyperparams
    from rl_zoo3.exp_manager import ExperimentManager
    from rl_zoo3.utils import get_model_path

    env_name = EnvironmentName(env_id)
    _, model_path, log_path = get_model_path(0, folder, algo, env_name)
    saved, stats_path = get_saved_hyperparams(
        os.path.join(log_path, env_name), norm_reward=False, test_mode=True
    )
    env_kwargs = saved.pop("env_kwargs", None) or {}
    env = create_test_env(
        env_name.gym_id,
        n_envs=1,
        stats_path=stats_path,
        seed=seeds[0],
        log_dir=None,
        should_render=False,
        hyperparams=saved,
        env_kwargs=env_kwargs,
        vec_env_cls=ExperimentManager.default_vec_env_cls,
    )
    # As RL-Zoo's enjoy loads a model: its schedules are not needed to act, and an
    # off-policy model does not need its replay buffer.
    custom_objects = {
        "learning_rate": 0.0,
        "lr_schedule": lambda _: 0.0,
        "clip_range": lambda _: 0.0,
    }
    kwargs: dict[str, Any] = {}
    if algo in {"dqn", "qrdqn", "ddpg", "sac", "td3", "tqc"}:
        kwargs["buffer_size"] = 1
    model = ALGOS[algo].load(model_path, custom_objects=custom_objects, device="cpu", **kwargs)
    returns: list[float] = []
    try:
        for seed in seeds:
            env.seed(seed)
            obs = env.reset()
            state = None
            start = np.ones((1,), dtype=bool)
            while True:
                action, state = model.predict(
                    obs, state=state, episode_start=start, deterministic=not sampled
                )
                obs, _reward, done, infos = env.step(action)
                start = done
                episode = infos[0].get("episode")
                if done[0] and episode is not None:
                    returns.append(float(episode["r"]))
                    break
    finally:
        env.close()
    return returns


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("versions")
    ask = commands.add_parser("hyperparams")
    ask.add_argument("pairs", nargs="+", type=lambda v: v.split(":", 1), metavar="ALGO:ENV")
    play = commands.add_parser("evaluate")
    play.add_argument("algo")
    play.add_argument("env")
    play.add_argument("folder")
    play.add_argument("--seeds", required=True, type=lambda v: [int(s) for s in v.split(",")])
    play.add_argument("--sampled", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "versions":
        print(json.dumps(versions()))
    elif args.command == "hyperparams":
        print(json.dumps([hyperparams(algo, env_id) for algo, env_id in args.pairs]))
    else:
        print(json.dumps(evaluate(args.algo, args.env, args.folder, args.seeds, args.sampled)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
