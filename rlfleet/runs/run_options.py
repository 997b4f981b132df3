"""Run options: an ML-Agents-style YAML file describing a whole run, as typed dataclasses.

One YAML section is one dataclass, one key one field (``docs/run-options.md`` is generated
from them)::

    env_settings:            EnvSettings         which env, how many copies, seed
    torch_settings:          TorchSettings       device, threads
    checkpoint_settings:     CheckpointSettings  run id, results dir, resume / force / init
    default_settings:        BehaviorSettings    merged under every behavior
    behaviors:               {name: BehaviorSettings}
    environment_parameters:  {name: EnvironmentParameterSettings}   samplers and curricula

How a behavior maps onto rlfleet's :class:`~rlfleet.runs.config.RunConfig`:

=========================================  ==============================================
run options                                RunConfig
=========================================  ==============================================
``trainer_type``                           ``algo``
``hyperparameters``                        ``hyperparameters`` (the algorithm's config)
``network_settings.hidden_units`` x        ``hyperparameters.hidden_sizes``
``num_layers``
``network_settings.normalize``             ``hyperparameters.normalize_obs``
``network_settings.memory``                ``hyperparameters.lstm_hidden_size`` and
                                           ``sequence_length``
``network_settings.vis_encode_type``       ``hyperparameters.cnn``
``time_horizon``                           ``hyperparameters.num_steps`` (rollout length)
``reward_signals.extrinsic.gamma``         ``hyperparameters.gamma``
``reward_signals``                         ``reward_signals``
``max_steps``                              ``trainer.max_steps``
``summary_freq``                           ``trainer.log_interval_steps``
``checkpoint_interval``                    ``trainer.epoch_num_steps`` (epoch + checkpoint)
``even_checkpoints``                       ``trainer.epoch_num_steps`` (max_steps / keep)
``keep_checkpoints``                       ``trainer.keep_checkpoints``
``trainer_settings``                       the other ``trainer`` settings
``env_settings``                           ``env`` and ``seed``
``torch_settings``                         ``device``, ``torch_threads``, ``deterministic``
``environment_parameters``                 ``environment_parameters``
``init_path``                              ``initialize_from`` of the run
``behavioral_cloning``                     ``behavioral_cloning``
``self_play`` (PettingZoo)                 ``multi_agent.self_play`` (and one shared
                                           network per behavior)
several behaviors (PettingZoo)             ``behaviors``: each one's agents, algorithm and
                                           hyperparameters
=========================================  ==============================================

ML-Agents' own names for hyperparameters and settings are rewritten into these before
validation (:mod:`rlfleet.runs.options_mlagents`).

The hyperparameters and trainer settings a behavior key maps onto (:data:`OWNED_HYPERPARAMETERS`,
:data:`OWNED_TRAINER_SETTINGS`) are set only through that key: naming them inside
``hyperparameters`` or ``trainer_settings`` is an error, and they are left out when the
options are written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from annotated_types import Interval

from rlfleet.algos.ppo import PPOConfig
from rlfleet.config.fields import (
    MAX_SEED,
    EnvCount,
    LayerCount,
    LayerWidth,
    NonNegativeInt,
    PositiveInt,
    ThreadCount,
    UnitFloat,
)
from rlfleet.config.loader import to_dict
from rlfleet.envs.curriculum import EnvironmentParameterSettings
from rlfleet.envs.make import VectorMode
from rlfleet.envs.parameters import ConstantSampler, Sampler
from rlfleet.marl.selfplay import SelfPlayConfig
from rlfleet.nn.cnn import CnnKind
from rlfleet.rewards.settings import RewardSignalsSettings, default_reward_signals
from rlfleet.train.behavioral_cloning import BehavioralCloningSettings
from rlfleet.train.loop import TrainerConfig

OWNED_HYPERPARAMETERS: dict[str, str] = {
    "num_steps": "time_horizon",
    "hidden_sizes": "network_settings.hidden_units and network_settings.num_layers",
    "normalize_obs": "network_settings.normalize",
    "gamma": "reward_signals.extrinsic.gamma",
}
"""Algorithm config field -> the behavior key that sets it (when the algorithm has the field)."""
OWNED_TRAINER_SETTINGS: dict[str, str] = {
    "max_steps": "max_steps",
    "log_interval_steps": "summary_freq",
    "epoch_num_steps": "checkpoint_interval",
    "keep_checkpoints": "keep_checkpoints",
}
"""TrainerConfig field -> the behavior key that sets it."""


VisEncodeType = Literal["simple", "nature_cnn", "resnet", "match3", "fully_connected"]
"""ML-Agents' visual encoders."""
VIS_ENCODERS: dict[str, CnnKind] = {"nature_cnn": "nature", "resnet": "impala"}
"""``vis_encode_type`` -> rlfleet's ``cnn`` (the encoders rlfleet has)."""


@dataclass
class MemorySettings:
    """A recurrent policy's memory (needs a recurrent algorithm)."""

    sequence_length: PositiveInt = 64
    """Length of the experience sequences the recurrent network is trained on."""
    memory_size: LayerWidth = 128
    """Size of the recurrent state."""


@dataclass
class NetworkSettings:
    """The policy and value networks."""

    hidden_units: LayerWidth = 128
    """Width of each hidden layer."""
    num_layers: LayerCount = 2
    """Number of hidden layers."""
    normalize: bool = False
    """Standardise observations with running statistics."""
    memory: MemorySettings | None = None
    """Recurrent memory; null for a feed-forward policy. Sets the algorithm's
    ``lstm_hidden_size`` to ``memory_size / 2`` (ML-Agents' memory holds the LSTM's hidden and
    cell states) and its ``sequence_length`` (algorithms with a recurrent policy: ppo, a2c)."""
    vis_encode_type: VisEncodeType | None = None
    """Encoder of image observations: ``nature_cnn`` (the algorithm's ``cnn: nature``) or
    ``resnet`` (``cnn: impala``, the IMPALA ResNet); ``simple``, ``match3`` and
    ``fully_connected`` are ML-Agents encoders rlfleet lacks, refused for an env with image
    observations and meaningless without; unset: the algorithm's ``cnn``."""
    conditioning_type: Literal["hyper", "none"] = "hyper"
    """How ML-Agents conditions a policy on goal observations (``goal_conditioning_type`` is
    accepted too). Gymnasium envs have no goal observations: every observation is a regular
    one, so this changes nothing."""
    deterministic: bool = False
    """ML-Agents: act with the distribution's mode. rlfleet's test episodes and exported
    policies always do, and training samples; true is noted in the log."""


@dataclass
class SelfPlaySettings:
    """ML-Agents' ``self_play`` section, with ML-Agents' defaults."""

    save_steps: PositiveInt = 20_000
    """Learner steps between snapshots of the policy."""
    team_change: PositiveInt | None = None
    """Learner steps between changes of the learning team (unset: ``5 * save_steps``)."""
    swap_steps: PositiveInt = 2_000
    """Steps of the agents playing snapshots between changes of their snapshot."""
    window: PositiveInt = 10
    """Snapshots kept to draw opponents from."""
    play_against_latest_model_ratio: UnitFloat = 0.5
    """Probability that an opponent is the current policy rather than a snapshot."""
    initial_elo: float = 1200.0
    """Starting Elo rating."""

    def config(self) -> SelfPlayConfig:
        """These settings as rlfleet's :class:`~rlfleet.marl.selfplay.SelfPlayConfig`."""
        return SelfPlayConfig(
            save_steps=self.save_steps,
            team_change=self.team_change_steps,
            swap_steps=self.swap_steps,
            play_against_latest_model_ratio=self.play_against_latest_model_ratio,
            window=self.window,
            initial_elo=self.initial_elo,
        )

    @property
    def team_change_steps(self) -> int:
        return self.team_change if self.team_change is not None else 5 * self.save_steps


def trainer_settings_defaults() -> TrainerConfig:
    """The settings a behavior's ``trainer_settings`` start from."""
    return TrainerConfig()


@dataclass
class BehaviorSettings:
    """How one behavior is trained (ML-Agents' trainer settings)."""

    trainer_type: str = "ppo"
    """Registered algorithm name (``rlfleet train --help`` lists them), but an offline one
    (bc, cql, iql, td3_bc), which needs a dataset that run options do not name."""
    hyperparameters: Any = field(default_factory=PPOConfig)
    """The algorithm's config (for ``ppo``: :class:`~rlfleet.algos.ppo.PPOConfig`), except
    the fields set by behavior keys: ``num_steps`` (``time_horizon``), ``hidden_sizes`` and
    ``normalize_obs`` (``network_settings``), ``gamma`` (``reward_signals.extrinsic``)."""
    network_settings: NetworkSettings = field(default_factory=NetworkSettings)
    """Policy and value networks."""
    reward_signals: RewardSignalsSettings = field(default_factory=default_reward_signals)
    """What the behavior maximises (default: the extrinsic reward alone)."""
    max_steps: PositiveInt = 500_000
    """Environment steps to train for."""
    time_horizon: PositiveInt = 64
    """Steps collected per env before an update (PPO's rollout length ``num_steps``); an
    episode cut there is bootstrapped from the value of the state reached. ML-Agents'
    ``hyperparameters.buffer_size``, where given, sets it to ``buffer_size / num_envs``
    (rounded up), and the ``time_horizon`` written here then sets
    ``hyperparameters.time_horizon``: trajectories are cut that often inside a rollout, as in
    ML-Agents."""
    summary_freq: PositiveInt = 50_000
    """Environment steps between history rows (and TensorBoard points)."""
    checkpoint_interval: PositiveInt = 500_000
    """Environment steps between checkpoints: rlfleet's ``epoch_num_steps``, so each also ends
    an epoch, which ends with a test step as the test cadence says."""
    keep_checkpoints: NonNegativeInt = 5
    """Checkpoints kept in ``checkpoints/`` (the oldest is deleted; 0 keeps all)."""
    even_checkpoints: bool = False
    """Ignore ``checkpoint_interval`` and space checkpoints evenly:
    ``max_steps / keep_checkpoints`` steps apart."""
    init_path: str | None = None
    """Start from the weights of another run (as ``checkpoint_settings.initialize_from``,
    which it may not be given with)."""
    threaded: bool = False
    """Step the envs on a thread of their own while the model updates (off-policy; the
    trainer setting ``threaded``, with its staleness bound). On-policy trainers note once in
    the log that it has no effect on them."""
    self_play: SelfPlaySettings | None = None
    """ML-Agents' self-play (PettingZoo games): one team learns while the others play
    snapshots of their past (see :mod:`rlfleet.marl.selfplay`); null: no self-play. A
    Gymnasium env has one agent, so there it must be null."""
    agents: list[str] | None = None
    """PettingZoo games: the env agents this behavior plays (unset: the agents whose name is
    the behavior's name or starts with it followed by ``_``; a file with one behavior: every
    agent)."""
    behavioral_cloning: BehavioralCloningSettings | None = None
    """ML-Agents' behavioral-cloning loss next to the RL loss (ppo and sac): after each
    update the policy also learns to take the demonstrated actions (see
    :mod:`rlfleet.train.behavioral_cloning`); null: no cloning."""
    trainer_settings: TrainerConfig = field(default_factory=trainer_settings_defaults)
    """rlfleet's other trainer settings (test episodes, early stopping, progress bar, ...),
    except the fields set by behavior keys: ``max_steps``, ``log_interval_steps``
    (``summary_freq``), ``epoch_num_steps`` (``checkpoint_interval``), ``keep_checkpoints``."""


@dataclass
class EnvSettings:
    """The environment."""

    env_id: str
    """Gymnasium env id (``CartPole-v1``), or ``module:EnvId`` to import the module that
    registers it."""
    num_envs: EnvCount = 8
    """Training envs stepped together."""
    seed: Annotated[int, Interval(ge=-1, le=MAX_SEED)] = 0
    """Seeds networks, sampling, env resets and environment parameters; -1 draws a seed
    (recorded in the run directory's ``run_options.yaml``)."""
    vector_mode: VectorMode = "auto"
    """``native``, ``sync``, ``async``, ``envpool`` or ``auto``; with environment parameters
    ``auto`` and ``native`` become ``sync`` (each sub-env needs its own reset) and ``envpool``
    is refused."""
    num_test_envs: EnvCount = 10
    """Envs the test episodes run on."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the env constructor."""


@dataclass
class TorchSettings:
    """Torch."""

    device: str = "cpu"
    """Torch device (``cpu``, ``cuda``, ``cuda:1``, ...)."""
    num_threads: ThreadCount | None = 1
    """CPU threads for torch (null: torch's default); one is fastest for small networks."""
    deterministic: bool = False
    """Refuse nondeterministic torch kernels (bitwise-repeatable runs)."""


@dataclass
class CheckpointSettings:
    """Where the run goes, and what to do when it exists."""

    run_id: str | None = None
    """Name of the run directory under ``results_dir`` (default: the options file's name)."""
    results_dir: str = "results"
    """Parent directory of run directories."""
    resume: bool = False
    """Continue the run ``results_dir/run_id`` from its latest checkpoint."""
    force: bool = False
    """Replace an existing run directory ``results_dir/run_id``."""
    initialize_from: str | None = None
    """Start from the weights of another run (a run id under ``results_dir``, or a run
    directory path): its latest checkpoint, else its best. Counters start from zero.
    Ignored when resuming."""


@dataclass
class RunOptions:
    """A whole run: the YAML file ``rlfleet train OPTIONS.yaml`` takes."""

    env_settings: EnvSettings
    """The environment."""
    behaviors: dict[str, BehaviorSettings] = field(default_factory=dict)
    """Behavior name -> settings. A Gymnasium env has one behavior (any name; without an
    entry it is named after the env id and uses ``default_settings``). A PettingZoo game may
    have several, each playing some of its agents with its own algorithm (see
    :func:`~rlfleet.runs.from_options.behavior_agents`)."""
    default_settings: BehaviorSettings | None = None
    """Settings merged under every behavior (a behavior's own keys win, key by key)."""
    environment_parameters: dict[str, EnvironmentParameterSettings] = field(default_factory=dict)
    """Parameter name -> a constant, a sampler, or a curriculum of lessons."""
    torch_settings: TorchSettings = field(default_factory=TorchSettings)
    """Torch device and threads."""
    checkpoint_settings: CheckpointSettings = field(default_factory=CheckpointSettings)
    """Run directory and resume / force / initialize-from."""


# ------------------------------------------------------------------ writing
def run_options_to_dict(options: RunOptions) -> dict[str, Any]:
    """Plain YAML-able data that :func:`~rlfleet.runs.options_parser.parse_run_options`
    reads back into equal options. Every key is written, nulls included, so that merging
    ``default_settings`` under a behavior on reading changes nothing."""
    out: dict[str, Any] = {"env_settings": to_dict(options.env_settings)}
    if options.default_settings is not None:
        out["default_settings"] = behavior_to_dict(options.default_settings)
    out["behaviors"] = {name: behavior_to_dict(b) for name, b in options.behaviors.items()}
    if options.environment_parameters:
        out["environment_parameters"] = {
            name: parameter_to_dict(p) for name, p in options.environment_parameters.items()
        }
    out["torch_settings"] = to_dict(options.torch_settings)
    out["checkpoint_settings"] = to_dict(options.checkpoint_settings)
    return out


def behavior_to_dict(behavior: BehaviorSettings) -> dict[str, Any]:
    data = to_dict(behavior)
    data["hyperparameters"] = {
        k: v for k, v in to_dict(behavior.hyperparameters).items() if k not in OWNED_HYPERPARAMETERS
    }
    data["trainer_settings"] = {
        k: v
        for k, v in to_dict(behavior.trainer_settings).items()
        if k not in OWNED_TRAINER_SETTINGS
    }
    return data


def parameter_to_dict(settings: EnvironmentParameterSettings) -> Any:
    """A number, a sampler mapping, or ``{curriculum: [...]}``: the shortest form that
    reads back into equal settings."""
    lessons = settings.curriculum
    only = lessons[0] if len(lessons) == 1 else None
    if (
        only is not None
        and only.completion_criteria is None
        and only.name == only.value.sampler_type
    ):
        return sampler_to_dict(only.value)
    curriculum = []
    for lesson in lessons:
        item: dict[str, Any] = {"name": lesson.name, "value": sampler_to_dict(lesson.value)}
        if lesson.completion_criteria is not None:
            item["completion_criteria"] = to_dict(lesson.completion_criteria)
        curriculum.append(item)
    return {"curriculum": curriculum}


def sampler_to_dict(sampler: Sampler) -> Any:
    """A constant as its number; any other sampler as ``{sampler_type, sampler_parameters}``."""
    if isinstance(sampler, ConstantSampler):
        return float(sampler.value)
    return {"sampler_type": sampler.sampler_type, "sampler_parameters": to_dict(sampler)}
