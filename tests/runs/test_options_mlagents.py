"""ML-Agents trainer configs load with ML-Agents' meanings, and train as they are.

``mlagents_configs/`` holds configs in the exact format ML-Agents ships
(``config/ppo/3DBall.yaml``, ``Basic.yaml``, ``Hallway.yaml``, ``config/sac/3DBall.yaml``,
``Walker.yaml``, ``config/imitation/Pyramids.yaml``): only ``env_settings`` (a Gymnasium env),
a small ``max_steps`` and the ``demo_path`` of imitation (``demos/ExpertCartPole.npz``, recorded
from a scripted CartPole controller) differ.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import yaml

from rlfleet.cli.main import main
from rlfleet.config.located import parse_yaml
from rlfleet.errors import ConfigError
from rlfleet.rewards.demonstrations import record_demonstrations
from rlfleet.runs.config import RunConfig, load_run_config
from rlfleet.runs.from_options import (
    check_encoder,
    initialize_from_dir,
    run_config_from_options,
)
from rlfleet.runs.options_mlagents import MLAGENTS_DEFAULTS, MLAGENTS_ONLY, RENAMES
from rlfleet.runs.options_parser import parse_run_options
from rlfleet.runs.run import load_algorithm
from rlfleet.runs.run_options import RunOptions, run_options_to_dict

CONFIGS = Path(__file__).parent / "mlagents_configs"
REPO = Path(__file__).resolve().parents[2]
"""Where ``demo_path`` in the corpus is relative to, as in ML-Agents' own configs."""

EXPECTED: dict[str, dict[str, Any]] = {
    "ppo_3DBall": {
        "algo": "ppo",
        "env.id": "Pendulum-v1",
        "hyperparameters.ent_coef": 0.001,  # beta
        "hyperparameters.clip_range": 0.2,  # epsilon
        "hyperparameters.gae_lambda": 0.99,  # lambd
        "hyperparameters.num_epochs": 3,  # num_epoch
        "hyperparameters.lr_schedule": "linear",  # learning_rate_schedule
        "hyperparameters.ent_coef_schedule": "linear",  # beta_schedule defaults to it
        "hyperparameters.clip_range_schedule": "linear",  # so does epsilon_schedule
        "hyperparameters.num_steps": 1500,  # buffer_size 12000 over 8 envs
        "hyperparameters.time_horizon": 1000,  # trajectories cut every 1000 steps
        "hyperparameters.batch_size": 64,
        "hyperparameters.normalize_obs": True,
        "hyperparameters.hidden_sizes": (128, 128),
        "hyperparameters.lstm_hidden_size": None,
        "trainer.max_steps": 4000,
        "trainer.log_interval_steps": 12000,
    },
    "ppo_Basic": {
        "env.id": "CartPole-v1",
        "hyperparameters.ent_coef": 0.005,
        "hyperparameters.num_steps": 32,  # buffer_size 256 over 8 envs
        "hyperparameters.time_horizon": 3,
        "hyperparameters.gamma": 0.9,
        "hyperparameters.hidden_sizes": (20,),
    },
    "ppo_Hallway": {
        "hyperparameters.ent_coef": 0.03,
        "hyperparameters.lstm_hidden_size": 64,  # memory_size 128: hidden and cell states
        "hyperparameters.sequence_length": 64,
        "hyperparameters.num_steps": 128,
        "hyperparameters.time_horizon": 64,
    },
    "imitation_Pyramids": {
        "hyperparameters.num_steps": 256,  # buffer_size 2048 over 8 envs
        "hyperparameters.time_horizon": 128,
        "behavioral_cloning.demo_path": "tests/runs/mlagents_configs/demos/ExpertCartPole.npz",
        "behavioral_cloning.strength": 0.5,
        "behavioral_cloning.steps": 150000,
        "behavioral_cloning.samples_per_update": 0,  # ML-Agents' default: all
        "behavioral_cloning.batch_size": None,  # the trainer's
    },
    "sac_3DBall": {
        "algo": "sac",
        "hyperparameters.ent_coef_init": 0.5,  # init_entcoef
        "hyperparameters.learning_starts": 0,  # buffer_init_steps
        "hyperparameters.train_freq": 10,  # steps_per_update 10: 10 env steps ...
        "hyperparameters.gradient_steps": 1,  # ... per gradient step
        "hyperparameters.buffer_size": 200000,
        "hyperparameters.batch_size": 64,
        "hyperparameters.tau": 0.005,
        "hyperparameters.hidden_sizes": (64, 64),
        "hyperparameters.normalize_obs": True,  # network_settings.normalize
        "trainer.save_replay_buffer": False,
    },
    "sac_Walker": {
        "hyperparameters.train_freq": 30,
        "hyperparameters.hidden_sizes": (512, 512, 512, 512),
        "hyperparameters.gamma": 0.995,
        "trainer.save_replay_buffer": False,
    },
}


def _get(config: RunConfig, dotted: str) -> Any:
    value: Any = config
    for part in dotted.split("."):
        value = getattr(value, part)
    return tuple(value) if isinstance(value, list) else value


def _parse(text: str, **kwargs: Any) -> RunOptions:
    return parse_run_options(parse_yaml(text, "options.yaml"), "options.yaml", **kwargs)


def _config(text: str) -> RunConfig:
    return run_config_from_options(_parse(text))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_shipped_config_trains_as_it_is_with_ml_agents_meanings(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    source = CONFIGS / f"{name}.yaml"
    assert main(["train", str(source), "--results-dir", str(tmp_path)]) == 0
    run = tmp_path / name
    config = load_run_config(run)
    for key, value in EXPECTED[name].items():
        assert _get(config, key) == value, key
    assert (run / "history.parquet").is_file()
    algo, _ = load_algorithm(run, which="latest")
    recurrent = algo.initial_state(1) is not None
    assert recurrent == (config.hyperparameters.__dict__.get("lstm_hidden_size") is not None)
    # The run directory's options speak rlfleet's names and read back to the same run.
    written = yaml.safe_load((run / "run_options.yaml").read_text())
    assert "beta" not in str(written)
    assert "buffer_init_steps" not in str(written)
    replay = run_config_from_options(parse_run_options(written, "run_options.yaml"))
    assert replay == config


def test_an_rlfleet_named_twin_gives_the_same_run() -> None:
    env = "env_settings: {env_id: CartPole-v1, num_envs: 4}\n"
    mlagents = _config(
        env + "behaviors:\n  B:\n    hyperparameters:\n"
        "      {batch_size: 64, buffer_size: 256, beta: 0.01, epsilon: 0.1, lambd: 0.9,\n"
        "       num_epoch: 4, learning_rate_schedule: constant}\n"
    )
    rlfleet = _config(
        env + "behaviors:\n  B:\n    time_horizon: 64\n    hyperparameters:\n"
        "      {batch_size: 64, ent_coef: 0.01, clip_range: 0.1, gae_lambda: 0.9,\n"
        "       num_epochs: 4}\n"
    )
    assert mlagents == rlfleet


def test_ml_agents_time_horizon_cuts_trajectories_inside_the_rollout() -> None:
    behavior = (
        "env_settings: {env_id: CartPole-v1, num_envs: 4}\nbehaviors:\n  B:\n"
        "    hyperparameters: {batch_size: 64, buffer_size: 256}\n"
    )
    hp = _config(behavior + "    time_horizon: 16\n").hyperparameters
    assert (hp.num_steps, hp.time_horizon) == (64, 16)  # buffer_size 256 over 4 envs
    # No shorter than the rollout: the rollout end is the only cut, as without the key.
    assert _config(behavior + "    time_horizon: 64\n").hyperparameters.time_horizon is None
    assert _config(behavior + "    time_horizon: 500\n").hyperparameters.time_horizon is None
    # Without buffer_size, time_horizon is rlfleet's rollout length and cuts nothing else.
    rlfleet = _config(
        "env_settings: {env_id: CartPole-v1, num_envs: 4}\nbehaviors:\n  B:\n"
        "    time_horizon: 16\n    hyperparameters: {batch_size: 64}\n"
    ).hyperparameters
    assert (rlfleet.num_steps, rlfleet.time_horizon) == (16, None)
    for bad in ("0", "true", "2.5"):
        with pytest.raises(ConfigError, match="time_horizon: expected a positive integer"):
            _parse(behavior + f"    time_horizon: {bad}\n")
    with pytest.raises(ConfigError, match=r"hyperparameters\.time_horizon: set by the behavior"):
        _parse(
            "env_settings: {env_id: CartPole-v1, num_envs: 4}\nbehaviors:\n  B:\n"
            "    hyperparameters: {batch_size: 64, buffer_size: 256, time_horizon: 8}\n"
        )


def test_the_imitation_demonstrations_are_the_scripted_controllers_recording() -> None:
    demos, returns = record_demonstrations(
        gym.make("CartPole-v1"), lambda o: int(o[2] + 0.5 * o[3] > 0), num_episodes=2
    )
    assert returns == [500.0, 500.0]
    with np.load(CONFIGS / "demos" / "ExpertCartPole.npz", allow_pickle=False) as saved:
        np.testing.assert_allclose(saved["observations"], demos.observations, rtol=1e-5)
        np.testing.assert_array_equal(saved["actions"], demos.actions)


def test_ml_agents_behavioral_cloning_loads_with_ml_agents_defaults() -> None:
    demo = CONFIGS / "demos" / "ExpertCartPole.npz"
    behavior = "env_settings: {env_id: CartPole-v1}\nbehaviors:\n  B:\n"
    cloning = _config(
        behavior + f"    behavioral_cloning: {{demo_path: '{demo}', strength: 0.5}}\n"
    ).behavioral_cloning
    assert cloning is not None
    assert (cloning.strength, cloning.steps, cloning.samples_per_update) == (0.5, 0, 0)
    assert (cloning.batch_size, cloning.num_epoch) == (None, None)  # the trainer's
    sac = _config(
        "env_settings: {env_id: Pendulum-v1}\nbehaviors:\n  B:\n    trainer_type: sac\n"
        "    behavioral_cloning: {demo_path: d.npz, steps: 100, batch_size: 32, num_epoch: 2}\n"
    ).behavioral_cloning
    assert sac is not None
    assert (sac.steps, sac.batch_size, sac.num_epoch) == (100, 32, 2)
    with pytest.raises(ConfigError, match=r"line 4: behaviors\.B\.behavioral_cloning\.demo_path"):
        _parse(behavior + "    behavioral_cloning: {demo_path: Demos/ExpertPyramid.demo}\n")
    with pytest.raises(ConfigError, match="dqn has no imitation loss"):
        _parse(behavior + "    trainer_type: dqn\n    behavioral_cloning: {demo_path: d.npz}\n")
    with pytest.raises(ConfigError, match="steps"):
        _parse(behavior + "    behavioral_cloning: {demo_path: d.npz, steps: -1}\n")


def test_rlfleet_names_keep_rlfleet_defaults_and_ml_agents_names_ml_agents_defaults() -> None:
    env = "env_settings: {env_id: CartPole-v1, num_envs: 8}\n"
    ours = _config(env + "behaviors:\n  B:\n    hyperparameters: {ent_coef: 0.01}\n")
    theirs = _config(env + "behaviors:\n  B:\n    hyperparameters: {beta: 0.01}\n")
    assert (ours.hyperparameters.num_epochs, ours.hyperparameters.batch_size) == (10, 256)
    assert ours.hyperparameters.lr_schedule == "constant"
    assert ours.hyperparameters.num_steps == 64
    hp = theirs.hyperparameters
    assert (hp.num_epochs, hp.batch_size, hp.num_steps) == (3, 1024, 1280)  # 10240 / 8
    assert (hp.lr_schedule, hp.ent_coef_schedule, hp.clip_range_schedule) == ("linear",) * 3
    schedules = _config(
        env + "behaviors:\n  B:\n    hyperparameters:\n"
        "      {beta: 0.01, learning_rate_schedule: constant, epsilon_schedule: linear}\n"
    ).hyperparameters
    assert (schedules.ent_coef_schedule, schedules.clip_range_schedule) == ("constant", "linear")


def _ml_agents_names() -> list[tuple[str, str, Any]]:
    """(trainer_type, one of ML-Agents' own hyperparameter names, a value it takes)."""
    values: dict[str, Any] = {
        "beta_schedule": "linear",
        "epsilon_schedule": "linear",
        "reward_signal_steps_per_update": 1,
    }
    return [
        (algo, name, MLAGENTS_DEFAULTS[algo].get(name, values.get(name)))
        for algo in ("ppo", "sac")
        for name in (*RENAMES[algo], *MLAGENTS_ONLY[algo])
    ]


@pytest.mark.parametrize(("algo", "name", "value"), _ml_agents_names())
def test_any_ml_agents_name_takes_ml_agents_defaults(algo: str, name: str, value: Any) -> None:
    # docs/coming-from-ml-agents.md: a hyperparameters section that uses any of ML-Agents'
    # own names takes ML-Agents' defaults for the keys it leaves out (batch_size here: 1024
    # for PPO, 128 for SAC, where rlfleet's is 256).
    env = "CartPole-v1" if algo == "ppo" else "Pendulum-v1"
    text = (
        f"env_settings: {{env_id: {env}}}\nbehaviors:\n  B:\n    trainer_type: {algo}\n"
        f"    hyperparameters: {{{name}: {yaml.safe_dump(value).splitlines()[0]}}}\n"
    )
    assert _config(text).hyperparameters.batch_size == MLAGENTS_DEFAULTS[algo]["batch_size"]


@pytest.mark.parametrize(
    ("steps_per_update", "train_freq", "gradient_steps"),
    [(1, 1, 1), (10.0, 10, 1), (0.25, 1, 4), (1.5, 3, 2)],
)
def test_steps_per_update_keeps_ml_agents_update_ratio(
    steps_per_update: float, train_freq: int, gradient_steps: int
) -> None:
    hp = _config(
        "env_settings: {env_id: Pendulum-v1}\nbehaviors:\n  B:\n    trainer_type: sac\n"
        f"    hyperparameters: {{steps_per_update: {steps_per_update}}}\n"
    ).hyperparameters
    assert (hp.train_freq, hp.gradient_steps) == (train_freq, gradient_steps)
    assert (hp.batch_size, hp.buffer_size, hp.learning_starts) == (128, 50000, 0)


def test_ml_agents_sac_on_discrete_actions_aims_at_ml_agents_target_entropy() -> None:
    # ML-Agents' SAC optimizer fixes the discrete target entropy at 0.2 * log(n); rlfleet's
    # own default is 0.5 * log(n), kept by a section in rlfleet's names.
    section = "env_settings: {env_id: Acrobot-v1}\nbehaviors:\n  B:\n    trainer_type: sac\n"
    theirs = _config(section + "    hyperparameters: {buffer_init_steps: 100}\n")
    ours = _config(section + "    hyperparameters: {learning_starts: 100}\n")
    assert theirs.hyperparameters.target_entropy_scale == 0.2
    assert ours.hyperparameters.target_entropy_scale == 0.5
    given = _config(
        section + "    hyperparameters: {buffer_init_steps: 100, target_entropy_scale: 0.7}\n"
    )
    assert given.hyperparameters.target_entropy_scale == 0.7


def test_network_and_checkpoint_keys() -> None:
    config = _config(
        "env_settings: {env_id: CartPole-v1}\nbehaviors:\n  B:\n"
        "    network_settings: {vis_encode_type: resnet, conditioning_type: none}\n"
        "    max_steps: 1000\n    keep_checkpoints: 4\n    even_checkpoints: true\n"
        "    checkpoint_interval: 10\n"
    )
    assert config.hyperparameters.cnn == "impala"
    assert config.trainer.epoch_num_steps == 250  # max_steps / keep_checkpoints
    nature = _config(
        "env_settings: {env_id: CartPole-v1}\nbehaviors:\n  B:\n"
        "    network_settings: {vis_encode_type: nature_cnn}\n"
    )
    assert nature.hyperparameters.cnn == "nature"


class ImageEnv(gym.Env[np.ndarray, int]):
    """A Gymnasium env with image observations."""

    observation_space = gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)
    action_space = gym.spaces.Discrete(2)


def test_an_encoder_rlfleet_lacks_is_refused_only_for_image_observations() -> None:
    image_env = f"env_settings: {{env_id: '{__name__}:ImageEnv'}}\n"
    for encoder in ("simple", "match3", "fully_connected"):
        options = _parse(
            image_env + f"behaviors:\n  B:\n    network_settings: {{vis_encode_type: {encoder}}}\n"
        )
        with pytest.raises(ConfigError, match=f"no '{encoder}' encoder.*use nature_cnn or resnet"):
            check_encoder(options)
    check_encoder(_parse(image_env + "behaviors:\n  B:\n    network_settings: {}\n"))
    vector = "env_settings: {env_id: CartPole-v1}\n"
    check_encoder(
        _parse(vector + "behaviors:\n  B:\n    network_settings: {vis_encode_type: simple}\n")
    )


UNITY_ONLY = """\
env_settings:
  env_id: CartPole-v1
  env_path: Builds/3DBall.app
  env_args: [--level, 2]
  base_port: 5005
  num_areas: 4
  timeout_wait: 60
engine_settings:
  width: 84
  height: 84
  quality_level: 5
  time_scale: 20
  target_frame_rate: -1
  capture_frame_rate: 60
  no_graphics: true
checkpoint_settings:
  train_model: false
torch_settings:
  device: cpu
debug: false
behaviors:
  CartPole:
    threaded: true
    network_settings: {deterministic: true}
"""


def test_unity_only_keys_are_accepted_and_each_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="rlfleet.runs"):
        options = _parse(UNITY_ONLY)
    assert options.env_settings.env_id == "CartPole-v1"
    lines = [r.getMessage() for r in caplog.records if r.name == "rlfleet.runs"]
    assert len(lines) == len(set(lines)) == 6, lines
    expected = [
        "engine_settings (width, height, quality_level, time_scale, target_frame_rate, "
        "capture_frame_rate, no_graphics) ignored: it sets up the Unity player",
        "env_settings env_args, base_port, num_areas, timeout_wait ignored: they configure "
        "a Unity executable",
        "env_path 'Builds/3DBall.app' ignored: it is not a Gymnasium env id",
        "train_model ignored",
        "debug ignored",
        "deterministic noted",
    ]
    for fragment in expected:
        assert sum(fragment in line for line in lines) == 1, fragment
    assert all(line.startswith("options.yaml line ") for line in lines)


def test_threaded_maps_to_the_trainer_setting() -> None:
    text = "env_settings: {env_path: Pendulum-v1}\nbehaviors:\n  P:\n    trainer_type: sac\n"
    assert _config(text).trainer.threaded is False
    assert _config(text + "    threaded: true\n").trainer.threaded is True


def test_env_path_names_a_gymnasium_env_and_torch_device_null_means_auto() -> None:
    options = _parse("env_settings: {env_path: Pendulum-v1}\ntorch_settings: {device: null}\n")
    assert options.env_settings.env_id == "Pendulum-v1"
    assert options.torch_settings.device in ("cpu", "cuda")
    loaded = _parse(
        "env_settings: {env_id: CartPole-v1}\ncheckpoint_settings: {load_model: true}\n"
    )
    assert loaded.checkpoint_settings.resume


BAD = [
    # One setting under both names.
    ("behaviors:\n  B:\n    hyperparameters: {beta: 0.1, ent_coef: 0.1}\n", ["beta", "ent_coef"]),
    (
        "behaviors:\n  B:\n    hyperparameters: {epsilon: 0.1, clip_range: 0.1}\n",
        ["epsilon", "clip_range"],
    ),
    (
        "behaviors:\n  B:\n    hyperparameters: {num_epoch: 1, num_epochs: 1}\n",
        ["num_epoch", "num_epochs"],
    ),
    (
        "behaviors:\n  B:\n    hyperparameters:\n      {learning_rate_schedule: linear, "
        "lr_schedule: linear}\n",
        ["learning_rate_schedule", "lr_schedule"],
    ),
    (
        "behaviors:\n  B:\n    trainer_type: sac\n    hyperparameters: {init_entcoef: 1, "
        "ent_coef_init: 1}\n",
        ["init_entcoef", "ent_coef_init"],
    ),
    (
        "behaviors:\n  B:\n    trainer_type: sac\n    hyperparameters: {steps_per_update: 2, "
        "train_freq: 2}\n",
        ["steps_per_update", "train_freq"],
    ),
    (
        "behaviors:\n  B:\n    trainer_type: sac\n    hyperparameters: {save_replay_buffer: true}\n"
        "    trainer_settings: {save_replay_buffer: true}\n",
        ["save_replay_buffer", "trainer_settings.save_replay_buffer"],
    ),
    (
        "behaviors:\n  B:\n    network_settings:\n      {goal_conditioning_type: none, "
        "conditioning_type: none}\n",
        ["goal_conditioning_type", "conditioning_type"],
    ),
    (
        "behaviors:\n  B:\n    network_settings: {memory: {memory_size: 64}}\n"
        "    hyperparameters: {lstm_hidden_size: 16}\n",
        ["memory.memory_size", "lstm_hidden_size"],
    ),
    (
        "behaviors:\n  B:\n    init_path: other\ncheckpoint_settings: {initialize_from: run}\n",
        ["init_path", "initialize_from"],
    ),
    # What rlfleet does not have.
    ("behaviors:\n  B:\n    hyperparameters: {shared_critic: true}\n", ["shared_critic"]),
    ("behaviors:\n  B:\n    self_play: {window: 10}\n", ["self_play", "PettingZoo"]),
    (
        "behaviors:\n  B:\n    behavioral_cloning: {demo_path: x.demo}\n",
        ["behavioral_cloning.demo_path", "ML-Agents .demo file", "expected an .npz"],
    ),
    (
        "behaviors:\n  B:\n    trainer_type: sac\n    hyperparameters: "
        "{learning_rate_schedule: linear}\n",
        ["sac keeps its learning rate constant"],
    ),
    (
        "behaviors:\n  B:\n    trainer_type: sac\n    hyperparameters:\n"
        "      {steps_per_update: 2, reward_signal_steps_per_update: 1}\n",
        ["reward_signal_steps_per_update", "must equal steps_per_update"],
    ),
    (
        "behaviors:\n  B:\n    network_settings: {memory: {memory_size: 33}}\n",
        ["memory_size", "must be even"],
    ),
    (
        "behaviors:\n  B:\n    max_steps: 100\n    keep_checkpoints: 0\n"
        "    even_checkpoints: true\n",
        ["even_checkpoints", "keep_checkpoints is 0"],
    ),
    ("engine_settings: {time_scal: 20}\n", ["time_scal", "did you mean 'time_scale'"]),
    ("checkpoint_settings: {inference: true}\n", ["inference", "rlfleet play"]),
]


@pytest.mark.parametrize(("text", "fragments"), BAD)
def test_contradictions_and_what_rlfleet_lacks_are_config_errors(
    text: str, fragments: list[str]
) -> None:
    with pytest.raises(ConfigError) as info:
        _parse("env_settings: {env_id: CartPole-v1}\n" + text)
    message = str(info.value)
    assert message.startswith("options.yaml line ")
    for fragment in fragments:
        assert fragment in message, (fragment, message)


@pytest.mark.parametrize(
    ("algo", "ml_name", "name"),
    [(algo, ml, ours) for algo, names in RENAMES.items() for ml, ours in names.items()],
)
def test_every_renamed_hyperparameter_under_both_names_is_an_error_naming_both(
    algo: str, ml_name: str, name: str
) -> None:
    # docs/coming-from-ml-agents.md: "one setting given under both names is an error that
    # names both" (the check comes before the values are read).
    text = (
        f"behaviors:\n  B:\n    trainer_type: {algo}\n"
        f"    hyperparameters: {{{ml_name}: 1, {name}: 1}}\n"
    )
    with pytest.raises(ConfigError) as info:
        _parse("env_settings: {env_id: CartPole-v1}\n" + text)
    message = str(info.value)
    assert f"{ml_name} (ML-Agents' name) and {name} (rlfleet's) are the same setting" in message


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        (
            "behaviors:\n  B:\n    network_settings: {vis_encode_type: nature_cnn}\n"
            "    hyperparameters: {cnn: impala}\n",
            ["network_settings.vis_encode_type", "hyperparameters.cnn is 'impala'"],
        ),
        (
            "checkpoint_settings: {load_model: true, resume: false}\n",
            ["load_model (ML-Agents' name) and resume (rlfleet's)"],
        ),
    ],
)
def test_the_two_names_of_a_derived_setting_may_agree_but_not_disagree(
    text: str, fragments: list[str]
) -> None:
    with pytest.raises(ConfigError) as info:
        _parse("env_settings: {env_id: CartPole-v1}\n" + text)
    for fragment in fragments:
        assert fragment in str(info.value)
    agreeing = text.replace("impala", "nature").replace("resume: false", "resume: true")
    _parse("env_settings: {env_id: CartPole-v1}\n" + agreeing)


def test_an_env_path_that_is_no_gymnasium_env_needs_env_id() -> None:
    with pytest.raises(ConfigError, match=r"'Builds/3DBall\.app' is not a registered Gymnasium"):
        _parse("env_settings: {env_path: Builds/3DBall.app}\n")
    with pytest.raises(ConfigError, match=r"env_path \(ML-Agents' name\) and env_id"):
        _parse("env_settings: {env_path: CartPole-v1, env_id: CartPole-v1}\n")


def test_written_options_read_back_equal() -> None:
    options = _parse(
        "env_settings: {env_id: CartPole-v1, num_envs: 4}\nbehaviors:\n  B:\n"
        "    hyperparameters: {beta: 0.02, buffer_size: 512, batch_size: 64}\n"
        "    network_settings: {memory: {memory_size: 32, sequence_length: 8},"
        " vis_encode_type: resnet}\n"
    )
    again = parse_run_options(run_options_to_dict(options), "again.yaml")
    assert run_config_from_options(again) == run_config_from_options(options)


def test_what_rlfleet_reads_differently_is_noted_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="rlfleet.runs"):
        _parse(
            "env_settings: {env_id: Pendulum-v1}\nbehaviors:\n  B:\n    trainer_type: ddpg\n"
            "    network_settings: {deterministic: true}\n"
        )
        _parse(
            "env_settings: {env_id: CartPole-v1, num_envs: 8}\nbehaviors:\n  B:\n"
            "    hyperparameters: {buffer_size: 1024, batch_size: 64}\n    time_horizon: 256\n"
        )
    lines = [r.getMessage() for r in caplog.records if r.name == "rlfleet.runs"]
    assert len(lines) == 2, lines
    assert "network_settings.deterministic noted" in lines[0]
    assert "time_horizon 256 is longer than the rollout" in lines[1]
    assert "trajectories are cut every 128 steps" in lines[1]


def test_ml_agents_gail_keys(tmp_path: Path) -> None:
    demo = tmp_path / "demo.npz"
    np.savez(demo, observations=np.zeros((4, 4), np.float32), actions=np.zeros(4, np.int64))
    behavior = "env_settings: {env_id: CartPole-v1}\nbehaviors:\n  B:\n    reward_signals:\n"
    gail = (
        _parse(
            behavior + f"      gail: {{demo_path: '{demo}', encoding_size: 32, use_vail: false}}\n"
        )
        .behaviors["B"]
        .reward_signals.gail
    )
    assert gail is not None
    assert gail.network_settings.hidden_units == 32
    with pytest.raises(ConfigError, match="use_vail: false"):
        _parse(behavior + f"      gail: {{demo_path: '{demo}', use_vail: true}}\n")


def test_default_settings_notes_are_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="rlfleet.runs"):
        _parse(
            "env_settings: {env_id: CartPole-v1, num_envs: 8}\ndefault_settings:\n"
            "  hyperparameters: {buffer_size: 1024, batch_size: 64}\n  time_horizon: 256\n"
        )
    lines = [r.getMessage() for r in caplog.records if r.name == "rlfleet.runs"]
    assert len(lines) == 1, lines


def test_init_path_names_the_run_to_start_from(tmp_path: Path) -> None:
    (tmp_path / "earlier").mkdir()
    options = _parse(
        "env_settings: {env_id: CartPole-v1}\n"
        f"checkpoint_settings: {{results_dir: '{tmp_path}'}}\n"
        "behaviors:\n  B:\n    init_path: earlier\n"
    )
    assert initialize_from_dir(options) == tmp_path / "earlier"


SIGNAL_NETWORKS = """\
behaviors:
  Pyramids:
    trainer_type: ppo
    hyperparameters:
      batch_size: 64
      buffer_size: 256
      learning_rate: 0.0003
      beta: 0.01
      epsilon: 0.2
      lambd: 0.95
      num_epoch: 1
      learning_rate_schedule: linear
    network_settings:
      normalize: false
      hidden_units: 32
      num_layers: 2
      vis_encode_type: simple
    reward_signals:
      extrinsic:
        gamma: 0.99
        strength: 1.0
        network_settings:
          normalize: false
          hidden_units: 128
          num_layers: 2
          vis_encode_type: simple
          memory: null
          goal_conditioning_type: hyper
          deterministic: false
      curiosity:
        gamma: 0.99
        strength: 0.02
        network_settings:
          normalize: false
          hidden_units: 24
          num_layers: 1
          vis_encode_type: simple
          memory: null
          goal_conditioning_type: hyper
          deterministic: false
        learning_rate: 0.0003
      rnd:
        gamma: 0.99
        strength: 0.01
        network_settings:
          hidden_units: 16
          num_layers: 3
          memory: {memory_size: 32, sequence_length: 8}
        learning_rate: 0.0001
    keep_checkpoints: 5
    max_steps: 512
    time_horizon: 32
    summary_freq: 512
env_settings:
  env_path: CartPole-v1
  num_envs: 8
  seed: 1
"""


def test_reward_signals_take_ml_agents_network_settings(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every reward signal carries ML-Agents' whole ``NetworkSettings`` (as ML-Agents writes
    them into a run's configuration.yaml): the learned signals' size is taken, the rest is
    noted once each."""
    with caplog.at_level(logging.WARNING, logger="rlfleet.runs"):
        signals = _parse(SIGNAL_NETWORKS).behaviors["Pyramids"].reward_signals
    assert signals.extrinsic is not None
    assert signals.curiosity is not None
    assert signals.curiosity.network_settings.hidden_sizes == (24,)
    assert signals.rnd is not None
    assert signals.rnd.network_settings.hidden_sizes == (16, 16, 16)
    lines = [r.getMessage() for r in caplog.records if r.name == "rlfleet.runs"]
    assert len(lines) == 3, lines
    assert "reward_signals.extrinsic.network_settings ignored" in lines[0]
    assert "curiosity.network_settings.normalize: false ignored" in lines[1]
    assert "rnd.network_settings.memory ignored" in lines[2]
    # It trains as it is.
    source = tmp_path / "Pyramids.yaml"
    source.write_text(SIGNAL_NETWORKS)
    assert main(["train", str(source), "--results-dir", str(tmp_path / "results")]) == 0
    config = load_run_config(tmp_path / "results" / "Pyramids")
    assert config.reward_signals.curiosity is not None
    assert config.reward_signals.curiosity.network_settings.hidden_sizes == (24,)


def test_an_unknown_key_in_a_signals_network_settings_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"network_settings\.hidden_unit: unknown key"):
        _parse(
            "env_settings: {env_id: CartPole-v1}\nbehaviors:\n  B:\n    reward_signals:\n"
            "      rnd: {network_settings: {hidden_unit: 8}}\n"
        )


def test_sac_network_settings_normalize_is_its_observation_normaliser(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="rlfleet.runs"):
        config = run_config_from_options(
            parse_run_options(parse_yaml((CONFIGS / "sac_3DBall.yaml").read_text(), "o"), "o")
        )
    assert config.hyperparameters.normalize_obs is True  # type: ignore[attr-defined]
    assert not [r for r in caplog.records if "normalize" in r.getMessage()]


@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.parametrize("trainer_type", ["impala", "appo"])
def test_actor_learner_trainer_types_train_from_ml_agents_options(
    trainer_type: str, tmp_path: Path
) -> None:
    """IMPALA and APPO have no batch_size (a batch is one rollout), and ML-Agents' default
    reward_signals (extrinsic at strength 1) is the env's own reward: both train."""
    options = tmp_path / "options.yaml"
    options.write_text(
        "env_settings: {env_id: CartPole-v1, num_envs: 4}\nbehaviors:\n  B:\n"
        f"    trainer_type: {trainer_type}\n    max_steps: 256\n"
    )
    assert main(["train", str(options), "--results-dir", str(tmp_path / "results")]) == 0
    assert (tmp_path / "results").is_dir()


@pytest.mark.usefixtures("ray_cluster")
def test_reward_signals_train_actor_learners(tmp_path: Path) -> None:
    options = tmp_path / "options.yaml"
    options.write_text(
        "env_settings: {env_id: CartPole-v1, num_envs: 2}\nbehaviors:\n  B:\n"
        "    trainer_type: impala\n    max_steps: 256\n"
        "    reward_signals: {extrinsic: {strength: 0.5, gamma: 0.99}, rnd: {strength: 0.1}}\n"
    )
    assert main(["train", str(options), "--results-dir", str(tmp_path / "results")]) == 0


@pytest.mark.parametrize("algo", ["bc", "cql", "iql", "td3_bc"])
def test_an_offline_trainer_type_is_refused_for_want_of_a_dataset(algo: str) -> None:
    text = f"env_settings: {{env_path: Pendulum-v1}}\nbehaviors:\n  P:\n    trainer_type: {algo}\n"
    with pytest.raises(ConfigError, match=rf"line 4.* {algo} learns from a dataset, which run"):
        _parse(text)
