"""Run options YAML: round trip, mapping onto RunConfig, overrides, and bad input."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from rlfleet.config.located import parse_yaml
from rlfleet.envs.parameters import GaussianSampler, MultiRangeUniformSampler, UniformSampler
from rlfleet.errors import ConfigError
from rlfleet.runs.from_options import resolve_run_options, run_config_from_options
from rlfleet.runs.options_parser import load_run_options, parse_run_options
from rlfleet.runs.run_options import run_options_to_dict

FULL = """\
env_settings:
  env_id: CartPole-v1
  num_envs: 4
  seed: 3
  env_kwargs: {sutton_barto_reward: false}
default_settings:
  time_horizon: 32
  network_settings: {hidden_units: 32}
behaviors:
  CartPole:
    trainer_type: ppo
    hyperparameters: {learning_rate: 3e-4, batch_size: 64, lr_schedule: linear}
    network_settings: {num_layers: 3, normalize: true}
    reward_signals:
      extrinsic: {gamma: 0.98, strength: 1.0}
      curiosity: {strength: 0.01, gamma: 0.98, encoding_size: 16}
      rnd: {strength: 0.02, gamma: 0.98, network_settings: {hidden_units: 16, num_layers: 1}}
    max_steps: 20000
    summary_freq: 1000
    checkpoint_interval: 5000
    keep_checkpoints: 2
    trainer_settings: {test_step_num_episodes: 3, show_progress: false}
environment_parameters:
  gravity: 9.8
  length: {sampler_type: uniform, sampler_parameters: {min_value: 0.4, max_value: 0.8}}
  masscart: {sampler_type: gaussian, sampler_parameters: {mean: 1.0, st_dev: 0.1}}
  masspole:
    curriculum:
      - name: light
        completion_criteria:
          {measure: reward, behavior: CartPole, threshold: 100, min_lesson_length: 10}
        value: 0.05
      - name: medium
        completion_criteria: {measure: progress, behavior: CartPole, threshold: 0.5}
        value:
          sampler_type: multirangeuniform
          sampler_parameters: {intervals: [[0.1, 0.2], [0.3, 0.4]]}
      - name: heavy
        value: 0.5
torch_settings: {device: cpu, num_threads: 1}
checkpoint_settings: {run_id: full, results_dir: results}
"""


def _load(text: str, *overrides: str) -> object:
    return parse_run_options(parse_yaml(text, "opts.yaml"), "opts.yaml", overrides=overrides)


def test_yaml_round_trip_is_identical() -> None:
    options = _load(FULL)
    text = yaml.safe_dump(run_options_to_dict(options), sort_keys=False)  # type: ignore[arg-type]
    again = _load(text)
    assert again == options
    assert yaml.safe_dump(run_options_to_dict(again), sort_keys=False) == text  # type: ignore[arg-type]


def test_sections_become_typed_settings() -> None:
    options = _load(FULL)
    behavior = options.behaviors["CartPole"]  # type: ignore[attr-defined]
    assert behavior.hyperparameters.learning_rate == pytest.approx(3e-4)
    assert behavior.time_horizon == 32  # from default_settings
    assert behavior.network_settings.hidden_units == 32  # merged key by key
    assert behavior.network_settings.num_layers == 3
    assert behavior.reward_signals.gail is None
    params = options.environment_parameters  # type: ignore[attr-defined]
    assert isinstance(params["length"].curriculum[0].value, UniformSampler)
    assert isinstance(params["masscart"].curriculum[0].value, GaussianSampler)
    lessons = params["masspole"].curriculum
    assert [lesson.name for lesson in lessons] == ["light", "medium", "heavy"]
    assert isinstance(lessons[1].value, MultiRangeUniformSampler)
    assert lessons[0].completion_criteria.min_lesson_length == 10


def test_options_map_onto_the_run_config() -> None:
    cfg = run_config_from_options(_load(FULL))  # type: ignore[arg-type]
    hp, trainer = cfg.hyperparameters, cfg.trainer
    assert cfg.algo == "ppo"
    assert (hp.num_steps, hp.hidden_sizes, hp.normalize_obs, hp.gamma) == (
        32,
        (32,) * 3,
        True,
        0.98,
    )
    assert (trainer.max_steps, trainer.log_interval_steps) == (20000, 1000)
    assert (trainer.epoch_num_steps, trainer.keep_checkpoints) == (5000, 2)
    assert trainer.test_step_num_episodes == 3
    assert (cfg.env.id, cfg.env.num_envs, cfg.seed) == ("CartPole-v1", 4, 3)
    assert cfg.env.kwargs == {"sutton_barto_reward": False}
    assert cfg.reward_signals is not None
    assert cfg.reward_signals.enabled() == [
        "extrinsic",
        "curiosity",
        "rnd",
    ]
    assert set(cfg.environment_parameters) == {"gravity", "length", "masscart", "masspole"}


def test_without_behaviors_the_behavior_is_named_after_the_env() -> None:
    options = _load("env_settings: {env_id: CartPole-v1}\n")
    assert list(options.behaviors) == ["CartPole-v1"]  # type: ignore[attr-defined]


def test_set_overrides_are_typed_and_validated() -> None:
    options = _load(
        FULL,
        "behaviors.CartPole.hyperparameters.learning_rate=1e-3",
        "env_settings.num_envs=2",
        "behaviors.CartPole.hyperparameters.batch_size=32",
    )
    behavior = options.behaviors["CartPole"]  # type: ignore[attr-defined]
    assert behavior.hyperparameters.learning_rate == pytest.approx(1e-3)
    assert options.env_settings.num_envs == 2  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"--set env_settings\.num_envs=two: env_settings"):
        _load(FULL, "env_settings.num_envs=two")
    with pytest.raises(ConfigError, match="did you mean 'learning_rate'"):
        _load(FULL, "behaviors.CartPole.hyperparameters.learnin_rate=1")
    with pytest.raises(ConfigError, match=r"expected dotted\.key=value"):
        _load(FULL, "behaviors.CartPole")


def test_resolved_options_fill_run_id_and_seed(tmp_path: Path) -> None:
    path = tmp_path / "my-run.yaml"
    path.write_text("env_settings: {env_id: CartPole-v1, seed: -1}\n")
    resolved = resolve_run_options(load_run_options(path, flags={"resume": True}), path)
    assert resolved.checkpoint_settings.run_id == "my-run"
    assert resolved.checkpoint_settings.resume is False
    assert resolved.env_settings.seed >= 0


BAD = [
    # (yaml, expected line, fragments of the message)
    (
        "env_settings: {env_id: CartPole-v1}\nbehaviors:\n  CartPole:\n"
        "    hyperparameters: {learnin_rate: 0.1}\n",
        4, ["behaviors.CartPole.hyperparameters.learnin_rate", "did you mean 'learning_rate'"],
    ),
    (
        "env_settings: {env_id: CartPole-v1}\nbehaviors:\n  CartPole:\n    trainer_type: a2c\n"
        "    hyperparameters:\n      lambd: 0.9\n",
        6, ["lambd", "gae_lambda here"],
    ),
    (
        "env_settings: {env_id: CartPole-v1}\nbehaviors:\n  CartPole:\n"
        "    hyperparameters:\n      lambd: 0.9\n      gae_lambda: 0.9\n",
        5, ["lambd (ML-Agents' name) and gae_lambda (rlfleet's) are the same setting"],
    ),
    (
        "env_settings: {env_id: Pendulum-v1}\nbehaviors:\n  Pendulum:\n    trainer_type: sac\n"
        "    hyperparameters:\n      buffer_init_steps: 1000\n      learning_starts: 5\n",
        6, ["buffer_init_steps", "learning_starts", "same setting"],
    ),
    (
        "env_settings: {env_id: CartPole-v1}\nenviroment_parameters: {}\n",
        2, ["did you mean 'environment_parameters'"],
    ),
    (
        "env_settings: {env_id: CartPole-v1}\nbehaviors:\n  CartPole:\n    max_steps: many\n",
        4, ["behaviors.CartPole.max_steps", "valid integer", "'many'"],
    ),
    (
        "env_settings: {env_id: CartPole-v1}\nbehaviors:\n  CartPole:\n    time_horizon: true\n",
        4, ["time_horizon", "expected a number"],
    ),
    (
        "env_settings: {env_id: CartPole-v1}\nbehaviors:\n  CartPole:\n"
        "    hyperparameters:\n      learning_rate: -0.1\n",
        5, ["learning_rate", "greater than 0"],
    ),
    (
        "env_settings:\n  env_id: CartPole-v1\n  num_envs: 0\n",
        3, ["env_settings.num_envs", "greater than 0"],
    ),
    (
        "env_settings: {env_id: CartPole-v1}\nbehaviors: {CartPole: {}}\n"
        "environment_parameters:\n  length:\n    curriculum:\n"
        "      - name: a\n        completion_criteria: {behavior: Walker, threshold: 1}\n"
        "        value: 0.5\n      - {name: b, value: 1.0}\n",
        7, ["completion_criteria.behavior", "'Walker' is not a behavior", "CartPole"],
    ),
    (
        "env_settings: {env_id: CartPole-v1}\nenvironment_parameters:\n  length:\n"
        "    sampler_type: uniform\n    sampler_parameters:\n"
        "      min_value: 2.0\n      max_value: 1.0\n",
        6, ["min_value (2.0) is greater than max_value (1.0)"],
    ),
    (
        "env_settings: {env_id: CartPole-v1}\nenvironment_parameters:\n  length:\n"
        "    sampler_type: multirange_uniform\n    sampler_parameters:\n"
        "      intervals: [[1, 2], [4, 3]]\n",
        6, ["interval 1 has min (4.0) greater than max (3.0)"],
    ),
    (
        "env_settings: {env_id: CartPole-v1}\nenvironment_parameters:\n  length:\n"
        "    sampler_type: triangular\n",
        4, ["sampler_type", "expected one of constant, uniform, gaussian, multirange_uniform"],
    ),
    (
        "env_settings: {env_id: CartPole-v1}\nenvironment_parameters:\n  length:\n"
        "    curriculum:\n      - {name: a, value: 0.5}\n      - {name: b, value: 1.0}\n",
        5, ["needs completion_criteria"],
    ),
    (
        "env_settings: {env_id: CartPole-v1}\nenvironment_parameters:\n  length:\n"
        "    curriculum:\n      - name: a\n        value: 0.5\n        completion_criteria:\n"
        "          {measure: progress, behavior: CartPole-v1, threshold: 2}\n"
        "      - {name: b, value: 1.0}\n",
        8, ["threshold", "outside [0, 1]"],
    ),
    (
        "env_settings: {env_id: CartPole-v1}\nbehaviors:\n  A: {}\n  B: {}\n",
        4, ["behaviors.B", "one behavior", "(A, B)"],
    ),
    (
        "env_settings: {env_id: CartPole-v1}\nbehaviors:\n  A:\n"
        "    hyperparameters: {num_steps: 16}\n",
        4, ["hyperparameters.num_steps", "set by the behavior key time_horizon"],
    ),
    (
        "env_settings: {env_id: CartPole-v2}\n",
        1, ["env_settings.env_id", "unknown Gymnasium env id 'CartPole-v2'", "CartPole-v1"],
    ),
    (
        "env_settings: {env_id: CartPole-v1}\nenvironment_parameters:\n  mass: 1.0\n",
        3, ["environment_parameters.mass", "no settable parameter 'mass'", "masspole"],
    ),
    (
        "env_settings: {env_id: CartPole-v1}\nbehaviors:\n  A: {trainer_type: ppp}\n",
        3, ["trainer_type", "unknown algorithm 'ppp'", "did you mean 'ppo'"],
    ),
    (
        "env_settings: {env_id: CartPole-v1}\ncheckpoint_settings:\n  resume: true\n"
        "  force: true\n",
        4, ["resume and force contradict"],
    ),
    (
        "env_settings: {env_id: CartPole-v1}\nenv_settings: {env_id: Pendulum-v1}\n",
        2, ["appears twice"],
    ),
    (
        "env_settings: {env_id: CartPole-v1, num_envs: 2}\nbehaviors:\n  A:\n"
        "    hyperparameters: {batch_size: 512}\n    time_horizon: 64\n",
        4, ["batch_size", "larger than the rollout", "64 x 2 = 128"],
    ),
    (
        "env_settings: {env_id: Pendulum-v1}\nbehaviors:\n  A:\n    trainer_type: sac\n"
        "    network_settings:\n      memory: {memory_size: 32}\n",
        6, ["memory", "no recurrent policy"],
    ),
    (
        "env_settings: {env_id: CartPole-v1}\nbehaviors:\n  A:\n    reward_signals:\n"
        "      gail: {demo_path: nowhere.npz}\n",
        5, ["gail.demo_path", "'nowhere.npz' not found"],
    ),
    ("env_settings: {env_id: [CartPole-v1}\n", 1, ["invalid YAML"]),
    ("behaviors: {}\n", None, ["env_settings", "required section missing"]),
]  # fmt: skip


@pytest.mark.parametrize(("text", "line", "fragments"), BAD)
def test_bad_input_names_file_line_and_key(
    tmp_path: Path, text: str, line: int | None, fragments: list[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_run_options(path)
    message = str(info.value)
    assert message.startswith(str(path)), message
    if line is not None:
        assert f"line {line}:" in message, message
    for fragment in fragments:
        assert fragment in message, message


def test_a_key_given_by_default_settings_is_located_there(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            env_settings: {env_id: CartPole-v1, num_envs: 8}
            default_settings:
              hyperparameters: {batch_size: 512}
            behaviors:
              A: {time_horizon: 8}
            """
        )
    )
    # Valid in default_settings (time_horizon 64), too large under A's time_horizon.
    with pytest.raises(ConfigError, match=r"line 3: behaviors\.A\.hyperparameters\.batch_size"):
        load_run_options(path)
    path.write_text("env_settings: {env_id: CartPole-v1}\ndefault_settings:\n  max_steps: -5\n")
    with pytest.raises(ConfigError, match=r"line 3: default_settings\.max_steps"):
        load_run_options(path)


def test_differing_gammas_warn() -> None:
    with pytest.warns(UserWarning, match="discounts the combined reward with one gamma"):
        _load(
            "env_settings: {env_id: CartPole-v1}\nbehaviors:\n  A:\n    reward_signals:\n"
            "      extrinsic: {gamma: 0.995}\n      curiosity: {gamma: 0.99}\n"
        )
