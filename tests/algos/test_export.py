"""ONNX export: every algorithm's graph, run by onnxruntime, takes the actions its torch
``predict`` takes, on observations recorded from its env."""

from __future__ import annotations

import dataclasses
import errno
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from gymnasium import spaces

from rlfleet.algos import PPO, SAC, PPOConfig, get_algorithm, list_algorithms
from rlfleet.algos.base import Algorithm
from rlfleet.algos.export import export_onnx, observation_layout
from rlfleet.algos.registry import algorithms_supporting_masks
from rlfleet.envs.make import make_vec_env
from rlfleet.errors import ConfigError, RunDirError
from rlfleet.nn.masks import MASK_KEY
from tests.algos.test_shared import SHORT_RUN, _algorithm_for_short_run

RECORDED = 1000
"""Observations recorded per algorithm."""


def _record(algo: Algorithm[Any], env_id: str) -> np.ndarray:
    """``RECORDED`` observations from 8 envs stepped with the policy's sampled actions."""
    envs = make_vec_env(env_id, 8, seed=3)
    try:
        obs, _ = envs.reset(seed=3)
        recorded = []
        while len(recorded) * 8 < RECORDED:
            recorded.append(obs)
            obs, *_ = envs.step(algo.predict(obs, deterministic=False))
    finally:
        envs.close()
    return np.concatenate(recorded)[:RECORDED]


def _run(path: Path, feed: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    actions: np.ndarray = session.run(["actions"], feed)[0]
    return actions


TIES_ALLOWED = 1
"""Discrete actions that may differ in a batch of ``RECORDED``: two runtimes sum in other
orders, so where two actions' scores tie to the last bits of a float32 their argmax can
differ (seen once in several thousand runs of this test). A wrong graph changes many."""


def _assert_same_actions(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.shape == expected.shape
    assert got.dtype == expected.dtype
    if np.issubdtype(expected.dtype, np.floating):
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)
    else:
        differ = (got != expected).reshape(len(got), -1).any(axis=1)
        assert differ.sum() <= TIES_ALLOWED, (
            f"{differ.sum()} of {len(got)} actions differ: rows {np.flatnonzero(differ)[:10]}"
        )


@pytest.mark.parametrize("name", list_algorithms())
def test_onnx_policy_takes_the_torch_policys_actions(name: str, tmp_path: Path) -> None:
    env_id = SHORT_RUN[name][0]
    # Weights moved far enough from their init for the greedy action to vary over the
    # recorded observations: the policies must not agree by always taking one action. The
    # first of a few fixed perturbations that gives such a policy is used.
    for seed in range(10):
        algo = _algorithm_for_short_run(name)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for module in algo.modules().values():
                for parameter in module.parameters():
                    noise = torch.randn(parameter.shape, generator=generator) * 0.05
                    parameter.add_(noise.to(parameter.dtype))
        obs = _record(algo, env_id)
        expected = algo.predict(obs)
        if len(np.unique(expected, axis=0)) > 1:
            break
    else:
        pytest.fail(f"{name}: no perturbation gave a policy that takes more than one action")
    path = algo.export_onnx(tmp_path / f"{name}.onnx")
    got = _run(path, {"obs": algo.obs_layout.to_tensor(obs).numpy()})
    _assert_same_actions(got, expected)


ACTION_SPACES: dict[str, spaces.Space[Any]] = {
    "discrete": spaces.Discrete(4, start=-1),
    "box": spaces.Box(-2.0, 2.0, (2,), np.float32),
    "multi-discrete": spaces.MultiDiscrete([3, 4], start=[1, 0]),
    "multi-binary": spaces.MultiBinary(3),
}


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        (name, kind)
        for name in list_algorithms()
        for kind, space in ACTION_SPACES.items()
        if isinstance(space, get_algorithm(name).action_spaces)
    ],
)
def test_every_action_space_an_algorithm_takes_exports_the_torch_policys_actions(
    name: str, kind: str, tmp_path: Path
) -> None:
    obs_space = spaces.Box(-1.0, 1.0, (5,), np.float32)
    algo = get_algorithm(name)(obs_space, ACTION_SPACES[kind], seed=2)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # weights away from their init, so that the actions vary
        for module in algo.modules().values():
            for parameter in module.parameters():
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.1)
    obs = np.random.default_rng(3).uniform(-1, 1, (RECORDED, 5)).astype(np.float32)
    expected = algo.predict(obs)
    assert len(np.unique(expected, axis=0)) > 1
    path = algo.export_onnx(tmp_path / f"{name}-{kind}.onnx")
    _assert_same_actions(_run(path, {"obs": obs}), expected)


NORMALIZING = [
    name
    for name in list_algorithms()
    if "normalize_obs" in {f.name for f in dataclasses.fields(get_algorithm(name).config_class)}
]
"""Every algorithm with an observation normaliser."""


@pytest.mark.parametrize("name", NORMALIZING)
def test_observation_normalisation_is_inside_the_graph(name: str, tmp_path: Path) -> None:
    space = spaces.Box(-100.0, 100.0, (3,), np.float32)
    cls = get_algorithm(name)
    actions: spaces.Space[Any] = (
        spaces.Discrete(3)
        if spaces.Discrete in cls.action_spaces
        else spaces.Box(-2.0, 2.0, (2,), np.float32)
    )
    algo = cls(space, actions, cls.config_class(normalize_obs=True), seed=1)
    rng = np.random.default_rng(0)
    obs = (rng.normal(size=(RECORDED, 3)) * [1.0, 30.0, 0.1] + [5.0, -40.0, 2.0]).astype(np.float32)
    if name in ("impala", "appo"):  # statistics that only their learner's update folds
        algo.obs_stats.normalizer.update(torch.from_numpy(obs))
    else:
        algo.preprocess(obs, update_stats=True)
    path = algo.export_onnx(tmp_path / f"{name}.onnx")
    expected = algo.predict(obs)
    _assert_same_actions(_run(path, {"obs": obs}), expected)
    assert len(np.unique(expected, axis=0)) > 1
    metadata = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    assert metadata["rlfleet.obs_normalization"] == "in_graph"


def test_box_actions_are_scaled_and_clipped_to_the_bounds(tmp_path: Path) -> None:
    """PPO's Gaussian mean is unbounded: the graph clips it, SAC's squashed action is
    scaled to the bounds, both as ``predict`` does."""
    # Bounds narrow enough for PPO's freshly initialised means to fall outside them.
    low, high = np.array([-3e-3, 0.0], np.float32), np.array([3e-3, 5e-3], np.float32)
    action_space = spaces.Box(low, high)
    obs = np.random.default_rng(0).normal(scale=50.0, size=(RECORDED, 4)).astype(np.float32)
    for cls in (PPO, SAC):
        algo = cls(spaces.Box(-np.inf, np.inf, (4,), np.float32), action_space, seed=2)
        if cls is PPO:  # means far outside the bounds, so that the clip is exercised
            raw = algo.act(algo.preprocess(obs), deterministic=True).actions.numpy()
            assert np.any(raw < action_space.low)
            assert np.any(raw > action_space.high)
        path = algo.export_onnx(tmp_path / f"{algo.name}.onnx")
        got = _run(path, {"obs": obs})
        _assert_same_actions(got, algo.predict(obs))
        assert np.all(got >= action_space.low)
        assert np.all(got <= action_space.high)


_DICT_SPACE = spaces.Dict(
    {
        "position": spaces.Box(-1.0, 1.0, (2,), np.float32),
        "item": spaces.Discrete(3, start=1),
        "flags": spaces.MultiBinary(2),
        "nested": spaces.Dict({"level": spaces.MultiDiscrete([2, 3])}),
        MASK_KEY: spaces.MultiBinary(4),
    }
)


def _dict_batch(n: int) -> dict[str, Any]:
    """``n`` Dict observations, each mask with at least one legal action."""
    _DICT_SPACE.seed(0)
    samples = [_DICT_SPACE.sample() for _ in range(n)]

    def stack(parts: list[Any]) -> Any:
        if isinstance(parts[0], dict):
            return {key: stack([p[key] for p in parts]) for key in parts[0]}
        return np.stack(parts)

    batch: dict[str, Any] = stack(samples)
    mask = batch[MASK_KEY]
    mask[np.arange(n), np.random.default_rng(0).integers(4, size=n)] = 1
    return batch


def test_dict_observations_and_action_masks(tmp_path: Path) -> None:
    """A Dict observation with a mask key: the graph takes the packed row and the mask, and
    never picks a masked-out action."""
    algo = PPO(_DICT_SPACE, spaces.Discrete(4, start=2), seed=3)
    obs = _dict_batch(RECORDED)
    path = algo.export_onnx(tmp_path / "ppo.onnx")
    mask = obs[MASK_KEY].astype(bool)
    feed = {"obs": algo.obs_layout.to_tensor(obs).numpy(), "action_mask": mask}
    got = _run(path, feed)
    _assert_same_actions(got, algo.predict(obs))
    assert mask[np.arange(RECORDED), got - 2].all()

    metadata = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    inputs = json.loads(metadata["rlfleet.inputs"])
    assert [i["name"] for i in inputs] == ["obs", "action_mask"]
    assert inputs[0]["shape"] == ["batch", algo.obs_layout.shape[0]]
    layout = json.loads(metadata["rlfleet.observation_layout"])
    assert layout == observation_layout(algo.obs_layout)
    # Parts in the Dict space's key order (gymnasium sorts a plain dict's keys).
    paths = [part["path"] for part in layout["parts"]]
    assert paths == [["flags"], ["item"], ["nested", "level"], ["position"]]
    assert layout["parts"][1] == {"path": ["item"], "offset": 2, "size": 3,
                                "encoding": "one_hot", "start": 1}  # fmt: skip
    assert sum(part["size"] for part in layout["parts"]) == layout["float_features"]


@pytest.mark.parametrize("name", algorithms_supporting_masks())
def test_every_masking_algorithm_exports_a_graph_that_never_picks_a_masked_action(
    name: str, tmp_path: Path
) -> None:
    # A vector observation, the mask input asked for (every masking algorithm takes these;
    # test_dict_observations_and_action_masks has the mask inside a Dict observation).
    algo = get_algorithm(name)(spaces.Box(-1.0, 1.0, (5,), np.float32), spaces.Discrete(4), seed=3)
    rng = np.random.default_rng(1)
    obs = rng.uniform(-1, 1, (RECORDED, 5)).astype(np.float32)
    mask = rng.random((RECORDED, 4)) < 0.5
    mask[np.arange(RECORDED), rng.integers(0, 4, RECORDED)] = True
    path = export_onnx(algo, tmp_path / f"{name}.onnx", action_mask=True)
    got = _run(path, {"obs": obs, "action_mask": mask})
    _assert_same_actions(got, algo.predict(obs, action_mask=mask))
    assert mask[np.arange(RECORDED), got].all()


def test_a_graph_without_the_mask_input_when_asked(tmp_path: Path) -> None:
    algo = get_algorithm("a2c")(_DICT_SPACE, spaces.Discrete(4), seed=4)
    path = export_onnx(algo, tmp_path / "a2c.onnx", action_mask=False)
    obs = _dict_batch(64)
    got = _run(path, {"obs": algo.obs_layout.to_tensor(obs).numpy()})
    ones = {**obs, MASK_KEY: np.ones_like(obs[MASK_KEY])}
    _assert_same_actions(got, algo.predict(ones))


def test_recurrent_policies_are_refused(tmp_path: Path) -> None:
    algo = PPO(spaces.Box(-1.0, 1.0, (3,)), spaces.Discrete(2), PPOConfig(lstm_hidden_size=8))
    with pytest.raises(ConfigError, match=r"recurrent policy.*feed-forward policies only"):
        algo.export_onnx(tmp_path / "ppo.onnx")
    assert not (tmp_path / "ppo.onnx").exists()


def test_mask_input_is_refused_where_masks_are_not_honoured(tmp_path: Path) -> None:
    bc = get_algorithm("bc")(spaces.Box(-1.0, 1.0, (3,)), spaces.Discrete(2))
    with pytest.raises(ConfigError, match="bc does not honour action masks"):
        bc.export_onnx(tmp_path / "bc.onnx", action_mask=True)
    ppo = PPO(spaces.Box(-1.0, 1.0, (3,)), spaces.Box(-1.0, 1.0, (2,)))
    with pytest.raises(ConfigError, match="cannot be masked"):
        ppo.export_onnx(tmp_path / "ppo.onnx", action_mask=True)


def test_export_changes_nothing_in_the_algorithm(tmp_path: Path) -> None:
    algo = _algorithm_for_short_run("ppo")
    before = algo.state_dict()
    modes = [m.training for module in algo.modules().values() for m in module.modules()]
    algo.export_onnx(tmp_path / "ppo.onnx")
    after = algo.state_dict()
    assert torch.equal(before["generator"], after["generator"])
    for key, state in before["modules"].items():
        for tensor_name, tensor in state.items():
            assert torch.equal(tensor, after["modules"][key][tensor_name])
    assert modes == [m.training for module in algo.modules().values() for m in module.modules()]


def test_a_model_that_cannot_be_written_is_a_run_dir_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk while saving the graph: a one-line RunDirError naming the file and the
    free space, and neither the model nor its temporary file is left."""
    algo = PPO(spaces.Box(-1.0, 1.0, (3,)), spaces.Discrete(2))

    def no_space(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(onnx, "save", no_space)
    with pytest.raises(RunDirError, match=r"ppo\.onnx: cannot write \(No space left on device; "):
        algo.export_onnx(tmp_path / "ppo.onnx")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "a-file").write_text("a file where the folder goes")
    with pytest.raises(RunDirError, match="cannot write"):
        algo.export_onnx(tmp_path / "a-file" / "ppo.onnx")
