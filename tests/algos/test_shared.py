"""Properties every registered algorithm must have, parametrized over the registry.

A new algorithm is tested here the moment it is registered: it needs an entry in
``REFERENCE`` (its reference task) to learn, and gets the other checks for free.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from gymnasium import spaces

import rlfleet
from rlfleet.algos import get_algorithm, list_algorithms
from rlfleet.algos.base import Algorithm
from rlfleet.algos.kinds import contract_of, declares_contract
from rlfleet.checkpoint import flatten_state, load_checkpoint, save_checkpoint
from rlfleet.collect.collector import Collector
from rlfleet.data.rollout import RolloutStorage
from rlfleet.envs.make import make_vec_env
from rlfleet.errors import ConfigError, EnvSpecError, NonFiniteError
from rlfleet.nn import precision
from rlfleet.nn.optim import NanPolicy
from rlfleet.runs.config import default_run_config
from rlfleet.runs.run import make_trainer
from tests.nan_injection import assert_unchanged, nan_gradients, nan_outputs, optimizer_state
from tests.offline.helpers import save_random_dataset

# algorithm -> (env id, overrides for a short run that trains something)
_SMALL_REPLAY = {
    "learning_starts": 256,
    "batch_size": 32,
    "buffer_size": 2000,
    "hidden_sizes": [32],
}
SHORT_RUN: dict[str, tuple[str, dict[str, Any]]] = {
    "ppo": (
        "CartPole-v1",
        {"hyperparameters": {"num_steps": 16, "num_epochs": 2, "batch_size": 64}},
    ),
    "impala": (
        "CartPole-v1",
        {
            "hyperparameters": {"num_steps": 16, "batch_fragments": 1},
            "distributed": {"num_actors": 1, "actor_num_cpus": 0.5},
        },
    ),
    "appo": (
        "CartPole-v1",
        {
            "hyperparameters": {"num_steps": 16, "batch_fragments": 1, "batch_size": 64},
            "distributed": {"num_actors": 1, "actor_num_cpus": 0.5},
        },
    ),
    "dqn": (
        "CartPole-v1",
        {
            "hyperparameters": {
                **_SMALL_REPLAY,
                "train_freq": 4,
                "gradient_steps": 1,
                "target_update_interval": 50,
                # 1-step transitions, which reward signals relabel (the CartPole preset's
                # are 3-step).
                "n_step": 1,
            }
        },
    ),
    "sac": ("Pendulum-v1", {"hyperparameters": _SMALL_REPLAY}),
    "td3": ("Pendulum-v1", {"hyperparameters": _SMALL_REPLAY}),
    "ddpg": ("Pendulum-v1", {"hyperparameters": _SMALL_REPLAY}),
    # Offline algorithms learn from a small random dataset of the env (see _datasets).
    "bc": ("CartPole-v1", {"hyperparameters": {"batch_size": 32, "hidden_sizes": [32]}}),
    "cql": (
        "Pendulum-v1",
        {"hyperparameters": {"batch_size": 32, "hidden_sizes": [32], "num_sampled_actions": 2}},
    ),
    "iql": ("Pendulum-v1", {"hyperparameters": {"batch_size": 32, "hidden_sizes": [32]}}),
    "td3_bc": ("Pendulum-v1", {"hyperparameters": {"batch_size": 32, "hidden_sizes": [32]}}),
    "a2c": ("CartPole-v1", {"hyperparameters": {"num_steps": 8}}),
    "trpo": (
        "CartPole-v1",
        {"hyperparameters": {"num_steps": 64, "batch_size": 64, "num_epochs": 2}},
    ),
    "acer": (
        "CartPole-v1",
        {"hyperparameters": {"num_steps": 16, "replay_start": 1, "replay_ratio": 2.0}},
    ),
}
_DATASETS: dict[str, Path] = {}
"""env id -> a small random dataset, written once per module by the ``_datasets`` fixture."""
QUIET = {"show_progress": False, "verbose": False}


@pytest.fixture(scope="module", autouse=True)
def _datasets(tmp_path_factory: pytest.TempPathFactory) -> None:
    for name, (env_id, _) in SHORT_RUN.items():
        if get_algorithm(name).kind == "offline" and env_id not in _DATASETS:
            _DATASETS[env_id] = save_random_dataset(env_id, tmp_path_factory.mktemp(env_id) / "d")


def _is_distributed(name: str) -> bool:
    return bool(get_algorithm(name).kind == "distributed")


@pytest.fixture
def cluster_if_distributed(request: pytest.FixtureRequest, name: str) -> None:
    """Distributed algorithms train on Ray actors: start the module's cluster for them."""
    if _is_distributed(name):
        request.getfixturevalue("ray_cluster")


def _run_short(name: str, seed: int) -> Any:
    trainer = _short_trainer(name, seed)
    try:
        trainer.run()
    finally:
        trainer.close()
    return trainer


def _short_trainer(
    name: str,
    seed: int,
    max_steps: int = 1024,
    *,
    epochs: int = 1,
    run_dir: Path | None = None,
    resume: bool = False,
    run: tuple[str, dict[str, Any]] | None = None,
    num_envs: int = 4,
    trainer_settings: dict[str, Any] | None = None,
) -> Any:
    """A trainer for ``name``'s short run (``run``: another env id and overrides;
    ``trainer_settings``: more trainer settings)."""
    env_id, overrides = run or SHORT_RUN[name]
    if get_algorithm(name).kind == "offline":
        # Offline steps are gradient steps: a few hundred train as much as a short online run.
        overrides = {**overrides, "dataset": str(_DATASETS[env_id])}
        max_steps = 200
    cfg = default_run_config(
        name,
        env_id,
        {
            **overrides,
            "seed": seed,
            "env": {"num_envs": num_envs, "num_test_envs": 2},
            "trainer": {
                **QUIET,
                "max_steps": max_steps,
                "epoch_num_steps": max_steps // epochs,
                "test_step_num_episodes": 2,
                "target_reward": None,
                **(trainer_settings or {}),
            },
        },
    )
    if run_dir is not None and not resume:
        run_dir.mkdir(parents=True)
    return make_trainer(cfg, run_dir, resume=resume)


def test_every_algorithm_has_a_short_run() -> None:
    assert set(list_algorithms()) <= set(SHORT_RUN)


COMPILABLE = ["a2c", "appo", "dqn", "impala", "ppo", "sac"]
"""The algorithms that compile their update: ``trainer.compile`` for PPO, A2C, DQN and SAC,
``distributed.th_compile`` for the actor-learners (docs/user-guide.md, docs/run-options.md)."""


def test_the_algorithms_that_offer_compile_are_the_documented_ones() -> None:
    offering = [
        name
        for name in list_algorithms()
        if get_algorithm(name).compile_update is not Algorithm.compile_update
    ]
    assert offering == COMPILABLE


@pytest.mark.parametrize("name", [n for n in list_algorithms() if n not in COMPILABLE])
def test_every_other_algorithm_refuses_compile_naming_those_that_offer_it(name: str) -> None:
    algo = _algorithm_for_short_run(name)
    offering = ", ".join(COMPILABLE)
    with pytest.raises(ConfigError, match=rf"^{name} does not support compiling .*: {offering}$"):
        algo.compile_update()


@pytest.mark.parametrize("name", [n for n in list_algorithms() if not _is_distributed(n)])
def test_every_single_process_algorithm_trains_with_bf16_update_steps(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``precision: bf16`` holds product results in bf16 and refuses to change one in place:
    every update step must run under it and leave finite fp32 weights that moved. (A CPU
    without bf16 instructions emulates them: slow, but the same numbers.)"""
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: True)
    trainer = _short_trainer(name, 0, 512, trainer_settings={"precision": "bf16"})
    params = [p for m in trainer.algorithm.modules().values() for p in m.parameters()]
    before = [p.detach().clone() for p in params]
    rounded_away = torch.full((1, 1), 1 + 2**-10)  # exact in fp32, 1.0 in bf16
    products: list[float] = []
    update = trainer.algorithm.update

    def probed_update(*args: Any, **kwargs: Any) -> Any:
        products.append(float(rounded_away @ torch.ones(1, 1)))
        return update(*args, **kwargs)

    trainer.algorithm.update = probed_update  # type: ignore[method-assign]
    try:
        trainer.run()
    finally:
        trainer.close()
    assert products  # every update step ran its products in bf16
    assert set(products) == {1.0}
    assert trainer.algorithm.gradient_steps > 0
    assert all(p.dtype == torch.float32 and bool(torch.isfinite(p).all()) for p in params)
    assert any(not torch.equal(p, b) for p, b in zip(params, before, strict=True))


@pytest.mark.parametrize("name", list_algorithms())
def test_no_algorithm_inherits_from_another(name: str) -> None:
    """One level of inheritance, plus the contract of its kind (an interface)."""
    cls = get_algorithm(name)
    assert cls.__bases__ == (Algorithm, contract_of(cls.kind))
    assert declares_contract(cls)


@pytest.mark.parametrize("name", list_algorithms())
def test_save_then_load_gives_identical_actions(name: str, tmp_path: Path) -> None:
    algo = _algorithm_for_short_run(name)
    obs = _observation_batch(algo)
    path = algo.save(tmp_path / "saved")
    loaded = rlfleet.load(path)
    assert type(loaded) is type(algo)
    assert loaded.config == algo.config
    assert torch.equal(loaded.parameters_vector(), algo.parameters_vector())
    for deterministic in (True, False):
        torch.manual_seed(0)
        expected = algo.predict(obs, deterministic=deterministic)
        torch.manual_seed(0)
        np.testing.assert_array_equal(loaded.predict(obs, deterministic=deterministic), expected)


def _algorithm_for_short_run(name: str) -> Algorithm[Any]:
    """``name`` built for its short run's env, its weights moved off their initial values
    (so that loading cannot pass by rebuilding the same initial weights from the seed)."""
    env_id, overrides = SHORT_RUN[name]
    cfg = default_run_config(name, env_id, {"hyperparameters": overrides["hyperparameters"]})
    envs = make_vec_env(env_id, 1)
    try:
        algo = get_algorithm(name)(
            envs.single_observation_space, envs.single_action_space, cfg.hyperparameters, seed=5
        )
    finally:
        envs.close()
    # A generator of its own: the same weights whatever ran before in this process.
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for module in algo.modules().values():
            for parameter in module.parameters():
                noise = torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype)
                parameter.add_(noise * 0.01)
    return algo


def _observation_batch(algo: Algorithm[Any]) -> np.ndarray:
    space = algo.observation_space
    space.seed(0)
    return np.stack([space.sample() for _ in range(4)])


# Actor-learner algorithms learn from asynchronous actors: which fragments reach each update
# depends on timing, so their whole runs are not bitwise repeatable; tests/algos/test_impala.py
# and test_appo.py check that their update is.
REPEATABLE_RUNS = [name for name in list_algorithms() if not _is_distributed(name)]


@pytest.mark.parametrize("name", REPEATABLE_RUNS)
def test_same_seed_gives_identical_parameters(name: str) -> None:
    first = _run_short(name, seed=3)
    second = _run_short(name, seed=3)
    other = _run_short(name, seed=4)
    assert torch.equal(first.algorithm.parameters_vector(), second.algorithm.parameters_vector())
    assert not torch.equal(first.algorithm.parameters_vector(), other.algorithm.parameters_vector())


@pytest.mark.usefixtures("cluster_if_distributed")
@pytest.mark.parametrize("name", list_algorithms())
def test_save_load_round_trip_gives_identical_actions(name: str, tmp_path: Path) -> None:
    algo = _run_short(name, seed=0).algorithm
    save_checkpoint(tmp_path / "ckpt", {"algorithm": algo.state_dict()}, {"algorithm": name})
    state, _ = load_checkpoint(tmp_path / "ckpt")
    fresh = get_algorithm(name)(algo.observation_space, algo.action_space, algo.config, seed=99)
    fresh.load_state_dict(state["algorithm"])
    obs = np.stack([algo.observation_space.sample() for _ in range(64)])
    np.testing.assert_array_equal(algo.predict(obs), fresh.predict(obs))
    assert torch.equal(algo.parameters_vector(), fresh.parameters_vector())
    # The sampling RNG continues identically too.
    torch.testing.assert_close(
        algo.act(algo.preprocess(torch.as_tensor(obs))).actions,
        fresh.act(fresh.preprocess(torch.as_tensor(obs))).actions,
    )


ACTION_SPACES: dict[str, spaces.Space[Any]] = {
    "MultiBinary": spaces.MultiBinary(3),
    "MultiDiscrete": spaces.MultiDiscrete([2, 3]),
    "Discrete": spaces.Discrete(2),
    "Box": spaces.Box(-1, 1, (2,), np.float32),
}


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        pytest.param(name, kind, id=f"{name}-{kind}")
        for name in list_algorithms()
        for kind, space in ACTION_SPACES.items()
        if not isinstance(space, get_algorithm(name).action_spaces)
    ],
)
def test_unsupported_action_space_is_refused_at_construction(name: str, kind: str) -> None:
    with pytest.raises(EnvSpecError, match=kind):
        get_algorithm(name)(spaces.Box(-1, 1, (3,), np.float32), ACTION_SPACES[kind])


@pytest.mark.parametrize(
    "name", [name for name in list_algorithms() if spaces.Box in get_algorithm(name).action_spaces]
)
def test_unbounded_box_actions_are_refused(name: str) -> None:
    cls = get_algorithm(name)
    with pytest.raises(EnvSpecError, match="infinite"):
        cls(spaces.Box(-1, 1, (3,), np.float32), spaces.Box(-np.inf, np.inf, (2,), np.float32))


@pytest.mark.parametrize("name", list_algorithms())
@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("learning_rate", -1e-3, r"greater than 0 \(got -0\.001\)"),
        ("learning_rate", float("nan"), r"\(got nan\)"),
        # Some algorithms take no batch size (the field is None): 0 is refused either way.
        ("batch_size", 0, r"\(got 0\)"),
    ],
)
def test_a_bad_config_built_in_python_is_refused_at_construction(
    name: str, field: str, value: Any, expected: str
) -> None:
    """A config made in Python is checked as one read from YAML is: the field named, one
    line, ConfigError rather than the optimiser's or a tensor's own error later on."""
    cls = get_algorithm(name)
    config = dataclasses.replace(cls.config_class(), **{field: value})
    with pytest.raises(ConfigError, match=rf"^{cls.config_class.__name__}\.{field}: .*{expected}$"):
        cls(spaces.Box(-1, 1, (3,), np.float32), _supported_actions(cls)[0], config)


def test_a_config_of_another_algorithm_is_refused_by_its_name() -> None:
    ppo, sac = get_algorithm("ppo"), get_algorithm("sac")
    with pytest.raises(ConfigError, match="expected a PPOConfig, got a SACConfig"):
        ppo(spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(2), sac.config_class())


def _supported_actions(cls: type[Algorithm[Any]]) -> list[spaces.Space[Any]]:
    return [space for space in ACTION_SPACES.values() if isinstance(space, cls.action_spaces)]


def _run_in(
    name: str, run_dir: Path, *, resume: bool = False, max_epochs: int | None, **short: Any
) -> Any:
    """A short run in ``run_dir`` with two epochs' budget, stopped after ``max_epochs``
    (``short``: more arguments of :func:`_short_trainer`)."""
    trainer = _short_trainer(name, seed=5, epochs=2, run_dir=run_dir, resume=resume, **short)
    trainer.config.max_epochs = max_epochs
    try:
        trainer.run()
    finally:
        trainer.close()
    return trainer


@pytest.mark.parametrize("name", REPEATABLE_RUNS)
def test_resume_continues_the_run_bitwise(name: str, tmp_path: Path) -> None:
    """Two epochs straight and one epoch, a fresh trainer resumed from the checkpoint, then
    one more give identical weights, optimiser state, RNG and counters."""
    _assert_resume_is_bitwise(name, tmp_path)


def _assert_resume_is_bitwise(name: str, tmp_path: Path, **short: Any) -> tuple[Any, Any]:
    """Two epochs straight equal one epoch and, resumed, a second (``short``: more arguments
    of :func:`_short_trainer`); returns the straight and the resumed trainer."""
    straight = _run_in(name, tmp_path / "straight", max_epochs=None, **short)
    _run_in(name, tmp_path / "split", max_epochs=1, **short)
    split = _run_in(name, tmp_path / "split", resume=True, max_epochs=None, **short)
    assert split.counters.epoch == straight.counters.epoch == 2
    assert (split.counters.env_step, split.counters.episode) == (
        straight.counters.env_step,
        straight.counters.episode,
    )
    a_tensors, a_skeleton = flatten_state(straight.algorithm.state_dict())
    b_tensors, b_skeleton = flatten_state(split.algorithm.state_dict())
    assert a_skeleton == b_skeleton
    different = [k for k in a_tensors if not torch.equal(a_tensors[k], b_tensors[k])]
    assert not different, different
    return straight, split


def _normalizing_run(name: str) -> tuple[str, dict[str, Any]]:
    """``name``'s short run with observation and reward normalisation, on Pendulum-v1 where
    it takes Box actions; rollouts of 16 steps (minibatches of 32 env steps where it sets
    a minibatch size)."""
    cls = get_algorithm(name)
    env_id = "Pendulum-v1" if spaces.Box in cls.action_spaces else "CartPole-v1"
    short = SHORT_RUN[name][1]["hyperparameters"]
    hyperparameters = {
        **short,
        "num_steps": 16,
        "normalize_obs": True,
        "normalize_reward": True,
        **({"batch_size": 32} if "batch_size" in short else {}),
    }
    return env_id, {"hyperparameters": hyperparameters}


NORMALIZING_RUNS = [
    name
    for name in REPEATABLE_RUNS
    if "normalize_reward"
    in {field.name for field in dataclasses.fields(get_algorithm(name).config_class)}
]


@pytest.mark.parametrize("name", NORMALIZING_RUNS)
def test_resume_continues_reward_normalisation_bitwise(name: str, tmp_path: Path) -> None:
    """The resume of :func:`test_resume_continues_the_run_bitwise` with the running
    statistics on, in the middle of episodes (Pendulum's last 200 steps): the per-env
    discounted returns that reward normalisation accumulates must continue."""
    _assert_resume_is_bitwise(name, tmp_path, run=_normalizing_run(name), num_envs=2, max_steps=256)


SDE_RUNS = [
    name
    for name in REPEATABLE_RUNS
    if "use_sde" in {field.name for field in dataclasses.fields(get_algorithm(name).config_class)}
]


COLORED_RUNS = [
    name
    for name in REPEATABLE_RUNS
    if "action_noise_color"
    in {field.name for field in dataclasses.fields(get_algorithm(name).config_class)}
]


@pytest.mark.parametrize("name", COLORED_RUNS)
def test_resume_continues_the_noise_bitwise(name: str, tmp_path: Path) -> None:
    """The resume of :func:`test_resume_continues_the_run_bitwise` with pink exploration
    noise on Pendulum-v1: the noise stream continues where it stopped."""
    hyperparameters = {**SHORT_RUN[name][1]["hyperparameters"], "action_noise_color": 1.0}
    if name in SDE_RUNS:  # the Pendulum presets of PPO and A2C explore with gSDE instead
        hyperparameters["use_sde"] = False
    straight, split = _assert_resume_is_bitwise(
        name,
        tmp_path,
        run=("Pendulum-v1", {"hyperparameters": hyperparameters}),
        max_steps=512,
    )
    noise = straight.algorithm.action_noise_process
    # One step per vector step of acting (4 envs): updates and greedy test steps use none.
    assert noise is not None
    assert 0 < noise.step <= straight.counters.env_step // 4
    assert split.algorithm.action_noise_process.step == noise.step


@pytest.mark.parametrize("name", SDE_RUNS)
def test_resume_continues_state_dependent_exploration_bitwise(name: str, tmp_path: Path) -> None:
    """The resume of :func:`test_resume_continues_the_run_bitwise` with gSDE on Pendulum-v1,
    its matrices redrawn every 3 steps: the resumed run explores with the same matrices."""
    hyperparameters = {**SHORT_RUN[name][1]["hyperparameters"], "use_sde": True}
    straight, split = _assert_resume_is_bitwise(
        name,
        tmp_path,
        run=("Pendulum-v1", {"hyperparameters": hyperparameters | {"sde_sample_freq": 3}}),
        max_steps=512,
    )
    exploration = straight.algorithm.exploration
    assert exploration is not None
    assert 0 < exploration.step <= straight.counters.env_step // 4
    assert split.algorithm.exploration.step == exploration.step


def _an_action_space(cls: type[Algorithm[Any]], n: int) -> spaces.Space[Any]:
    """``Discrete(n)`` where the algorithm takes Discrete actions, else a 2-d Box."""
    if spaces.Discrete in cls.action_spaces:
        return spaces.Discrete(n)
    return spaces.Box(-1, 1, (2,), np.float32)


_IMAGE = spaces.Box(0, 255, (36, 36, 3), np.uint8)
OBSERVATION_SPACES: dict[str, tuple[spaces.Space[Any], bool]] = {
    # what the error names: (observation space, holds an image)
    "Discrete": (spaces.Discrete(3), False),
    "Dict": (spaces.Dict({"a": spaces.Box(-1, 1, (2,), np.float32)}), False),
    "no image encoder": (_IMAGE, True),
    "Dict(": (spaces.Dict({"pixels": _IMAGE}), True),
}


def _refuses_observation(cls: type[Algorithm[Any]], match: str) -> bool:
    observation, has_image = OBSERVATION_SPACES[match]
    supported = isinstance(observation, cls.observation_spaces) and (
        cls.supports_images or not has_image
    )
    return not supported


@pytest.mark.parametrize(
    ("name", "match"),
    [
        pytest.param(name, match, id=f"{name}-{match}")
        for name in list_algorithms()
        for match in OBSERVATION_SPACES
        if _refuses_observation(get_algorithm(name), match)
    ],
)
def test_unsupported_observation_space_is_refused_at_construction(name: str, match: str) -> None:
    cls = get_algorithm(name)
    with pytest.raises(EnvSpecError, match=re.escape(match)):
        cls(OBSERVATION_SPACES[match][0], _an_action_space(cls, 2))


@pytest.mark.parametrize("name", list_algorithms())
def test_reward_signals_work_online_and_are_refused_otherwise(name: str, tmp_path: Path) -> None:
    """On- and off-policy runs learn from the signals' rewards and train the signals; offline
    runs refuse signals before any env is built, and so do actor-learner runs with several
    learners (with one, the driver's learner applies them: tests/runs/test_distributed_agent.py
    trains such a run on Ray)."""
    env_id, overrides = SHORT_RUN[name]
    kind = get_algorithm(name).kind
    if kind == "offline":
        overrides = {**overrides, "dataset": str(_DATASETS[env_id])}
    signals = {"extrinsic": {"strength": 1.0}, "curiosity": {"strength": 0.1}}
    cfg = default_run_config(
        name,
        env_id,
        {
            **overrides,
            "reward_signals": signals,
            "env": {"num_envs": 4, "num_test_envs": 2},
            "trainer": {**QUIET, "max_steps": 512, "epoch_num_steps": 512,
                        "test_step_num_episodes": 1, "target_reward": None},
        },
    )  # fmt: skip
    if kind == "distributed":
        assert cfg.distributed is not None
        cfg.distributed.num_learners = 2
    if kind not in ("on_policy", "off_policy"):
        with pytest.raises(ConfigError, match="reward signals"):
            make_trainer(cfg, None)
        return
    trainer = make_trainer(cfg, tmp_path)
    try:
        trainer.run()
    finally:
        trainer.close()
    history = pq.read_table(tmp_path / "history.parquet").to_pydict()
    assert [v for v in history["train/intrinsic_curiosity_reward"] if v is not None]
    assert [v for v in history["loss/curiosity_forward"] if v is not None]


@pytest.mark.parametrize("name", list_algorithms())
def test_greedy_actions_draw_no_randomness(name: str) -> None:
    """Test steps, eval and play act greedily: no epsilon, no action noise, no sampling."""
    cls = get_algorithm(name)
    action = _an_action_space(cls, 3)
    algo = cls(spaces.Box(-1, 1, (3,), np.float32), action)
    obs = np.random.default_rng(0).uniform(-1, 1, (32, 3)).astype(np.float32)
    before = algo.generator.get_state()
    first = algo.predict(obs, deterministic=True)
    np.testing.assert_array_equal(first, algo.predict(obs, deterministic=True))
    assert torch.equal(algo.generator.get_state(), before)


# ------------------------------------------------------------------ non-finite guard
_TRAINED: dict[str, tuple[Algorithm[Any], Any]] = {}
"""name -> (an algorithm that has trained a little, the data its update takes)."""


def _trained(name: str) -> tuple[Algorithm[Any], Any]:
    """An algorithm whose optimisers all have state (so a step would show), and its data:
    a short run's rollout or buffer, or, for actor-learner algorithms, a rollout collected
    and learned from here (no Ray cluster needed)."""
    if name not in _TRAINED:
        if _is_distributed(name):
            envs = make_vec_env("CartPole-v1", 4, seed=0)
            obs_space, act_space = envs.single_observation_space, envs.single_action_space
            algo = get_algorithm(name)(obs_space, act_space, seed=0)
            data: Any = RolloutStorage.for_spaces(32, 4, obs_space, act_space)
            Collector(envs, algo, seed=0).collect_rollout(data)
            envs.close()
            algo.update(data)
        else:
            trainer = _short_trainer(name, seed=0, max_steps=512)
            try:
                trainer.run()
            finally:
                trainer.close()
            algo = trainer.algorithm
            data = trainer.storage if algo.kind == "on_policy" else trainer.buffer
        _TRAINED[name] = (algo, data)
    return _TRAINED[name]


FRESH_GRADIENT_STEPS = 4
"""Gradient steps of an off-policy or offline update in :func:`_fresh`: several, so that
delayed actor steps (TD3, TD3+BC) come round too."""


def _fresh(name: str, nan_policy: NanPolicy) -> tuple[Algorithm[Any], Callable[[], Any]]:
    """A copy of the trained algorithm and a call of its update on the same data."""
    trained, data = _trained(name)
    algo = get_algorithm(name)(
        trained.observation_space, trained.action_space, trained.config, seed=trained.seed
    )
    algo.load_state_dict(copy.deepcopy(trained.state_dict()))
    algo.nan_policy = nan_policy
    if algo.kind in ("off_policy", "offline"):
        return algo, lambda: algo.update(data, num_gradient_steps=FRESH_GRADIENT_STEPS)
    return algo, lambda: algo.update(data)


@pytest.mark.parametrize("nan_policy", ["raise", "skip_batch"])
@pytest.mark.parametrize("name", list_algorithms())
def test_a_nan_loss_never_reaches_weights_or_optimizer_state(
    name: str, nan_policy: NanPolicy
) -> None:
    """Every network output turns NaN during the update (so every loss is NaN): the first
    optimiser step of each batch must stop it, by raising or by skipping the batch."""
    algo, update = _fresh(name, nan_policy)
    optimizers = list(algo.optimizers().values())
    params, state = algo.parameters_vector().clone(), optimizer_state(optimizers)
    assert state, "the optimisers should have state from training"
    steps = algo.gradient_steps
    nan_outputs(algo.modules().values())
    if nan_policy == "raise":
        with pytest.raises(NonFiniteError, match="parameters were left unchanged"):
            update()
    else:
        update()
        assert algo.skipped_batches > 0
    assert torch.equal(algo.parameters_vector(), params), f"{name}: parameters changed"
    assert_unchanged(state, optimizer_state(optimizers), f"{name}: optimizer state")
    assert algo.gradient_steps == steps


@pytest.mark.parametrize("nan_policy", ["raise", "skip_batch"])
@pytest.mark.parametrize("name", list_algorithms())
def test_a_nan_gradient_never_reaches_weights_or_optimizer_state(
    name: str, nan_policy: NanPolicy
) -> None:
    """The losses stay finite but the gradients of one network's parameters turn NaN, for
    each network in turn (so every optimiser step is tried, also one that comes after
    another's step in a gradient step, and TRPO's natural-gradient actor step, which has no
    optimiser), then of every parameter. The poisoned parameters and their optimisers'
    state must not move, and no weight may become NaN."""
    modules = _trained(name)[0].modules()
    targets = [k for k, m in modules.items() if any(p.requires_grad for p in m.parameters())]
    for target in [*targets, None]:
        algo, update = _fresh(name, nan_policy)
        poisoned = [
            p
            for k, m in algo.modules().items()
            if target in (None, k)
            for p in m.parameters()
            if p.requires_grad
        ]
        ids = {id(p) for p in poisoned}
        chosen = [
            o
            for o in algo.optimizers().values()
            if any(id(p) in ids for group in o.param_groups for p in group["params"])
        ]
        before = [p.detach().clone() for p in poisoned]
        state = optimizer_state(chosen)
        assert state or not chosen, "the optimisers should have state from training"
        # Networks no optimiser steps (target networks, ACER's average policy) move only at
        # the end of a gradient step, after every optimiser step of it.
        followers = {
            k: [p.detach().clone() for p in m.parameters()]
            for k, m in algo.modules().items()
            if not any(p.requires_grad for p in m.parameters())
        }
        steps = algo.gradient_steps
        nan_gradients(poisoned)
        where = f"{name} ({target or 'every parameter'})"
        if nan_policy == "raise":
            with pytest.raises(NonFiniteError, match="gradient norm"):
                update()
        else:
            skipped = algo.skipped_batches
            update()
            assert algo.skipped_batches > skipped, f"{where}: no batch was skipped"
        assert_unchanged(before, [p.detach() for p in poisoned], f"{where}: parameters")
        assert_unchanged(state, optimizer_state(chosen), f"{where}: optimizer state")
        # docs/reliability.md: everything after the skipped step in that batch's gradient
        # step stays as it was too: target-network updates and the gradient-step counter.
        # A delayed actor (TD3's policy_delay) steps in some gradient steps only: those
        # before its first one complete as they should. TRPO's policy
        # step is no counted gradient step: its critic's minibatch steps that follow are
        # gradient steps of their own, each on its own minibatch.
        delay = getattr(algo.config, "policy_delay", 1) if target == "actor" else 1
        completed = min((delay - 1 - steps % delay) % delay, FRESH_GRADIENT_STEPS)
        if (name, target) != ("trpo", "actor"):
            assert algo.gradient_steps == steps + completed, f"{where}: the counter moved"
            modules = algo.modules()
            for key, values in followers.items():
                now = [p.detach() for p in modules[key].parameters()]
                assert_unchanged(values, now, f"{where}: {key}")
        assert torch.isfinite(algo.parameters_vector()).all(), f"{where}: non-finite weights"


@pytest.mark.parametrize(
    "name",
    [name for name in list_algorithms() if spaces.Discrete in get_algorithm(name).action_spaces],
)
def test_discrete_actions_with_a_start_stay_in_the_space(name: str) -> None:
    """``act`` returns indices 0..n-1 and ``env_actions`` alone shifts them by ``start``, so a
    Discrete(3, start=5) space gets actions 5, 6 and 7, greedy or sampled."""
    space = spaces.Discrete(3, start=5)
    algo = get_algorithm(name)(spaces.Box(-1, 1, (4,), np.float32), space, seed=0)
    obs = np.random.default_rng(0).uniform(-1, 1, (256, 4)).astype(np.float32)
    for deterministic in (True, False):
        actions = algo.predict(obs, deterministic=deterministic)
        assert set(np.unique(actions)) <= {5, 6, 7}, (deterministic, np.unique(actions))
        indices = algo.act(algo.preprocess(obs), deterministic=deterministic).actions
        assert int(indices.min()) >= 0
        assert int(indices.max()) < 3
