"""``trainer.cuda_graphs``: the parts of a captured gradient step that run on the CPU (the
static batch, Adam with a tensor learning rate and a skip flag, the refusals), and, where
CUDA is available, the captured DQN and SAC steps against the eager ones."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from rlfleet.algos.base import Algorithm
from rlfleet.algos.registry import algorithm_classes
from rlfleet.errors import ConfigError, NonFiniteError
from rlfleet.nn.cuda_graph import CapturedSteps, fill_static, to_static
from rlfleet.nn.deterministic import box_batch
from rlfleet.nn.optim import adam, captured_steps_taken, fused_adam_step
from rlfleet.nn.precision import bf16_support
from rlfleet.runs.config import default_run_config
from rlfleet.runs.run import make_trainer
from rlfleet.types import ReplayBatch

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _batch(n: int, masks: bool = False, fill: float = 1.0) -> ReplayBatch[torch.Tensor]:
    return ReplayBatch(
        obs=torch.full((n, 3), fill),
        actions=torch.zeros(n, dtype=torch.long),
        rewards=torch.full((n,), fill),
        next_obs=torch.full((n, 3), fill),
        discounts=torch.ones(n),
        weights=torch.ones(n),
        indices=np.arange(n),
        next_action_masks=torch.ones(n, 2, dtype=torch.bool) if masks else None,
    )


def test_a_static_batch_is_refilled_in_place_and_refuses_another_layout() -> None:
    static = to_static(_batch(4), torch.device("cpu"))
    first = _batch(4)
    assert static.obs.data_ptr() != first.obs.data_ptr()
    storage = static.obs.data_ptr()
    assert fill_static(static, _batch(4, fill=5.0))
    assert static.obs.data_ptr() == storage
    assert bool((static.obs == 5.0).all())
    assert not fill_static(static, _batch(3))  # another batch size
    assert not fill_static(static, _batch(4, masks=True))  # masks where there were none
    assert bool((static.obs == 5.0).all())  # a refused batch copies nothing


def test_dict_observations_are_refilled_key_by_key() -> None:
    static = to_static({"a": torch.zeros(2), "b": torch.zeros(2, 2)}, torch.device("cpu"))
    assert fill_static(static, {"a": torch.ones(2), "b": torch.ones(2, 2)})
    assert float(static["a"].sum() + static["b"].sum()) == 6.0
    assert not fill_static(static, {"a": torch.ones(2)})


LR = 2**-10
"""A learning rate float32 holds exactly, so that a float32 tensor of it is the number."""


def _net_and_adam() -> tuple[torch.nn.Module, torch.optim.Adam]:
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 3)
    return net, adam(net.parameters(), LR, 1e-8, torch.device("cpu"))


def _gradients(net: torch.nn.Module, scale: float) -> None:
    for p in net.parameters():
        p.grad = None
    (net(torch.ones(2, 4) * scale) ** 2).sum().backward()


def test_adam_with_a_tensor_learning_rate_steps_as_with_the_groups_float() -> None:
    eager, eager_adam = _net_and_adam()
    tensor, tensor_adam = _net_and_adam()
    for step in range(5):
        _gradients(eager, step + 1.0)
        _gradients(tensor, step + 1.0)
        fused_adam_step(eager_adam)  # type: ignore[arg-type]
        fused_adam_step(tensor_adam, lr=torch.tensor(LR), skip=torch.tensor(False))  # type: ignore[arg-type]
    for a, b in zip(eager.parameters(), tensor.parameters(), strict=True):
        assert torch.equal(a, b)
        assert torch.equal(eager_adam.state[a]["exp_avg_sq"], tensor_adam.state[b]["exp_avg_sq"])
        assert float(tensor_adam.state[b]["step"]) == 5


def test_a_skipped_adam_step_changes_no_parameter_moment_or_count() -> None:
    net, optimizer = _net_and_adam()
    _gradients(net, 1.0)
    fused_adam_step(optimizer)  # type: ignore[arg-type]
    before = {k: v.clone() for k, v in net.state_dict().items()}
    state = {id(p): {k: v.clone() for k, v in optimizer.state[p].items()} for p in net.parameters()}
    _gradients(net, 2.0)
    fused_adam_step(optimizer, lr=torch.tensor(LR), skip=torch.tensor(True))  # type: ignore[arg-type]
    for k, v in net.state_dict().items():
        assert torch.equal(v, before[k])
    for p in net.parameters():
        for k, v in optimizer.state[p].items():
            assert torch.equal(v, state[id(p)][k]), k


class _Learner:
    def __init__(self, nan_policy: Any) -> None:
        self.nan_policy = nan_policy
        self.skipped_batches = 0

    def step_label(self) -> str:
        return "learner"


def test_after_a_replay_the_first_failed_check_meets_the_nan_policy() -> None:
    """Checks are (loss, norm) pairs in the order of the optimiser steps; the first that is
    not finite is the one reported, once."""
    finite = [torch.tensor(1.0), torch.tensor(2.0)]
    assert captured_steps_taken(_Learner("raise"), finite * 3) == 3
    bad = [
        torch.tensor(1.0),
        torch.tensor(float("inf")),
        torch.tensor(float("nan")),
        torch.tensor(0.0),
    ]
    learner = _Learner("skip_batch")
    assert captured_steps_taken(learner, [*finite, *bad]) == 1
    assert learner.skipped_batches == 1
    with pytest.raises(
        NonFiniteError, match=r"^learner: non-finite loss \(1\) or gradient norm \(inf\)"
    ):
        captured_steps_taken(_Learner("raise"), [*finite, *bad])


def _dqn_config(device: str, hyperparameters: dict[str, Any] | None = None, **trainer: Any) -> Any:
    return default_run_config(
        "dqn",
        "CartPole-v1",
        {
            "device": device,
            "seed": 0,
            "torch_threads": 1,
            "hyperparameters": {
                "learning_starts": 100,
                "target_update_interval": 50,
                **(hyperparameters or {}),
            },
            "trainer": {
                "max_steps": 1_000,
                "epoch_num_steps": 500,
                "test_step_num_episodes": 1,
                "show_progress": False,
                "verbose": False,
                **trainer,
            },
        },
    )


def test_cuda_graphs_are_refused_on_a_device_that_is_not_cuda() -> None:
    with pytest.raises(ConfigError, match=r"cuda_graphs needs a CUDA device, got device cpu"):
        make_trainer(_dqn_config("cpu", cuda_graphs=True), None)


def test_dqn_sac_td3_and_ddpg_are_the_algorithms_that_offer_cuda_graphs() -> None:
    """Every other algorithm keeps the base class's refusal (the docs and the refusal's
    message name these alone)."""
    offering = [
        name
        for name, cls in algorithm_classes().items()
        if cls.capture_update is not Algorithm.capture_update
    ]
    assert sorted(offering) == ["ddpg", "dqn", "sac", "td3"]


def _sac_config(
    device: str,
    env_id: str = "Pendulum-v1",
    hyperparameters: dict[str, Any] | None = None,
    algo: str = "sac",
    **trainer: Any,
) -> Any:
    return default_run_config(
        algo,
        env_id,
        {
            "device": device,
            "seed": 0,
            "torch_threads": 1,
            "hyperparameters": {"learning_starts": 100, **(hyperparameters or {})},
            "trainer": {
                "max_steps": 600,
                "epoch_num_steps": 300,
                "test_step_num_episodes": 1,
                "show_progress": False,
                "verbose": False,
                **trainer,
            },
        },
    )


@pytest.mark.parametrize("algo", ["sac", "td3", "ddpg"])
def test_actor_critics_refuse_cuda_graphs_on_a_device_that_is_not_cuda(algo: str) -> None:
    with pytest.raises(
        ConfigError, match=rf"^{algo}: trainer.cuda_graphs needs a CUDA device, got device cpu$"
    ):
        make_trainer(_sac_config("cpu", algo=algo, cuda_graphs=True), None)


def test_sac_refuses_cuda_graphs_on_discrete_actions() -> None:
    with pytest.raises(
        ConfigError,
        match=r"^sac: .*of Box actions; expected a Box action space, got Discrete\(2\)$",
    ):
        make_trainer(_sac_config("cpu", "CartPole-v1", cuda_graphs=True), None)


def test_cuda_graphs_are_refused_by_an_algorithm_that_does_not_offer_them() -> None:
    cfg = default_run_config(
        "ppo", "CartPole-v1", {"trainer": {"cuda_graphs": True, "show_progress": False}}
    )
    with pytest.raises(
        ConfigError, match=r"ppo does not support capturing .* do: ddpg, dqn, sac, td3$"
    ):
        make_trainer(cfg, None)


def test_cuda_graphs_are_refused_with_compile() -> None:
    with pytest.raises(ConfigError, match=r"expected compile: false and precision: fp32"):
        make_trainer(_dqn_config("cpu", cuda_graphs=True, compile=True), None)


@pytest.mark.skipif(
    bf16_support(torch.device("cpu")) is not None,
    reason="bf16 is refused on this CPU before cuda_graphs is looked at",
)
def test_cuda_graphs_are_refused_with_bf16() -> None:
    with pytest.raises(ConfigError, match=r"expected compile: false and precision: fp32"):
        make_trainer(_dqn_config("cpu", cuda_graphs=True, precision="bf16"), None)


def _trained_parameters(cfg: Any) -> tuple[list[torch.Tensor], Any]:
    trainer = make_trainer(cfg, None)
    trainer.run()
    algorithm = trainer.algorithm
    return [p.detach().cpu() for p in algorithm.q_net.parameters()], algorithm


@CUDA
@pytest.mark.parametrize(
    "hyperparameters",
    [{}, {"dueling": True}, {"prioritized": True, "lr_schedule": "linear"}],
    ids=["plain", "dueling", "prioritized-linear-lr"],
)
def test_a_captured_dqn_step_trains_the_parameters_of_the_eager_one(
    hyperparameters: dict[str, Any],
) -> None:
    eager, _ = _trained_parameters(_dqn_config("cuda", hyperparameters))
    graphed, algorithm = _trained_parameters(_dqn_config("cuda", hyperparameters, cuda_graphs=True))
    assert algorithm._graphed is not None
    assert algorithm._graphed.captured
    for a, b in zip(eager, graphed, strict=True):
        if "lr_schedule" in hyperparameters:  # the learning rate rounded to float32
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        else:
            assert torch.equal(a, b)


@CUDA
def test_a_captured_step_with_a_non_finite_loss_leaves_the_weights_and_obeys_nan_policy() -> None:
    cfg = _dqn_config("cuda", cuda_graphs=True, nan_policy="skip_batch")
    trainer = make_trainer(cfg, None)
    trainer.run()
    algorithm = trainer.algorithm
    assert algorithm._graphed.captured
    source = trainer.buffer
    before = [p.detach().clone() for p in algorithm.q_net.parameters()]
    steps = algorithm.gradient_steps
    source.rewards[:] = float("nan")
    algorithm.update(source, num_gradient_steps=2)
    assert algorithm.skipped_batches == 2
    assert algorithm.gradient_steps == steps
    for a, b in zip(before, algorithm.q_net.parameters(), strict=True):
        assert torch.equal(a, b)
    algorithm.nan_policy = "raise"
    with pytest.raises(NonFiniteError, match="non-finite loss"):
        algorithm.update(source)
    for a, b in zip(before, algorithm.q_net.parameters(), strict=True):
        assert torch.equal(a, b)


def _sac_parameters(cfg: Any) -> tuple[list[torch.Tensor], Any]:
    trainer = make_trainer(cfg, None)
    trainer.run()
    algorithm = trainer.algorithm
    return [
        v.detach().cpu() for m in algorithm.modules().values() for v in m.state_dict().values()
    ], algorithm


@CUDA
@pytest.mark.parametrize("hyperparameters", [{}, {"ent_coef": 0.1}], ids=["tuned", "fixed-alpha"])
def test_a_captured_sac_step_trains_the_parameters_of_the_eager_one(
    hyperparameters: dict[str, Any],
) -> None:
    """Actor, critics, their targets and the entropy coefficient, bitwise."""
    eager, _ = _sac_parameters(_sac_config("cuda", hyperparameters=hyperparameters))
    graphed, algorithm = _sac_parameters(
        _sac_config("cuda", hyperparameters=hyperparameters, cuda_graphs=True)
    )
    assert algorithm._captures is not None
    assert algorithm._captures.captured
    assert len(eager) == len(graphed)
    for a, b in zip(eager, graphed, strict=True):
        assert torch.equal(a, b)


@CUDA
def test_a_captured_sac_step_with_a_non_finite_critic_loss_keeps_the_entropy_step_alone() -> None:
    """As an eager step: the entropy coefficient's step (before the critics) stays; the
    critics, the actor, the targets and the step count do not move; nan_policy applies."""
    trainer = make_trainer(_sac_config("cuda", cuda_graphs=True, nan_policy="skip_batch"), None)
    trainer.run()
    algorithm = trainer.algorithm
    assert algorithm._captures.captured
    source = trainer.buffer
    networks = ("actor", "critic", "critic_target")

    def weights() -> dict[str, list[torch.Tensor]]:
        modules = algorithm.modules()
        return {k: [p.detach().clone() for p in modules[k].parameters()] for k in networks}

    before, alpha = weights(), algorithm.ent_coef.log_value.detach().clone()
    steps = algorithm.gradient_steps
    source.rewards[:] = float("nan")
    algorithm.update(source, num_gradient_steps=2)
    assert algorithm.skipped_batches == 2
    assert algorithm.gradient_steps == steps
    after = weights()
    for k in networks:
        for a, b in zip(before[k], after[k], strict=True):
            assert torch.equal(a, b), k
    assert not torch.equal(alpha, algorithm.ent_coef.log_value.detach())
    algorithm.nan_policy = "raise"
    with pytest.raises(NonFiniteError, match="non-finite loss"):
        algorithm.update(source)
    for k, tensors in weights().items():
        for a, b in zip(before[k], tensors, strict=True):
            assert torch.equal(a, b), k


def _two_trained(algo: str) -> tuple[Any, Any, Any]:
    """Two algorithms trained alike on the CPU (the same seed and steps), and the first one's
    replay buffer, to step the same minibatches eagerly and through a captured step's
    function."""
    trainers = [make_trainer(_sac_config("cpu", algo=algo), None) for _ in range(2)]
    for trainer in trainers:
        trainer.run()
    return trainers[0].algorithm, trainers[1].algorithm, trainers[0].buffer


def test_sacs_captured_step_function_run_eagerly_trains_as_the_eager_step() -> None:
    """The function a capture records (``_captured_box_step``), run as it is on the CPU, moves every
    parameter and optimiser state as the eager step does, bitwise; its checks are finite."""
    eager, captured, source = _two_trained("sac")
    for _ in range(3):
        sample = source.sample(64, gamma=0.99, n_step=1, progress=0.5)
        eager_terms = eager._box_step(eager._box_batch(sample))
        captured_terms, *checks = captured._captured_box_step(captured._box_batch(sample))
        assert torch.equal(eager_terms, captured_terms)
        assert len(checks) == 6  # loss and norm of the entropy, critic and actor steps
        assert all(bool(torch.isfinite(c).all()) for c in checks)
    for name, module in eager.modules().items():
        for (key, a), b in zip(
            module.state_dict().items(), captured.modules()[name].state_dict().values(), strict=True
        ):
            assert torch.equal(a, b), (name, key)
    for name, optimizer in eager.optimizers().items():
        other = captured.optimizers()[name]
        for p, q in zip(optimizer.state.values(), other.state.values(), strict=True):
            for key in p:
                assert torch.equal(p[key], q[key]), (name, key)


def _state(algorithm: Any) -> list[torch.Tensor]:
    """Every network's and optimiser's tensors."""
    tensors = [v for m in algorithm.modules().values() for v in m.state_dict().values()]
    for optimizer in algorithm.optimizers().values():
        tensors += [v for state in optimizer.state.values() for v in state.values()]
    return tensors


@pytest.mark.parametrize("algo", ["td3", "ddpg"])
def test_the_captured_step_functions_of_td3_and_ddpg_run_eagerly_train_as_the_eager_steps(
    algo: str,
) -> None:
    """The functions a capture records, run as they are on the CPU (TD3's with and without
    its actor step), move every parameter and optimiser state as the eager steps do."""
    eager, captured, source = _two_trained(algo)
    for step in range(4):
        sample = source.sample(64, gamma=0.99, n_step=1, progress=0.5)
        # Each draws its smoothing noise (TD3) from its own generator, equal to the other's.
        eager_batch, batch = (
            box_batch(sample, lambda o: o, a.nets.to_unit, generator=a.generator, next_noise=True)
            if algo == "td3"
            else box_batch(sample, lambda o: o, a.nets.to_unit)
            for a in (eager, captured)
        )
        if algo == "td3":
            with_actor = step % 2 == 1
            losses = eager._step(eager_batch, with_actor, None)
            assert len(losses) == (2 if with_actor else 1)
            record = captured._captured_actor_step if with_actor else captured._captured_critic_step
            outputs = record(batch)
            assert len(outputs) == 3 * len(losses)  # the losses, then a loss and a norm each
        else:
            losses = (eager._step(eager_batch, None),)
            outputs = captured._captured_step(batch)
            assert len(outputs) == 5  # the losses, then the two steps' losses and norms
        for a, b in zip(losses, outputs, strict=False):
            assert torch.equal(a, b)
        assert all(bool(torch.isfinite(c).all()) for c in outputs)
    for a, b in zip(_state(eager), _state(captured), strict=True):
        assert torch.equal(a, b)


@CUDA
@pytest.mark.parametrize(
    ("algo", "hyperparameters"),
    [("td3", {}), ("td3", {"policy_delay": 3}), ("ddpg", {})],
    ids=["td3", "td3-delay-3", "ddpg"],
)
def test_captured_td3_and_ddpg_steps_train_the_parameters_of_the_eager_ones(
    algo: str, hyperparameters: dict[str, Any]
) -> None:
    runs = []
    for graphs in (False, True):
        cfg = _sac_config("cuda", hyperparameters=hyperparameters, algo=algo, cuda_graphs=graphs)
        trainer = make_trainer(cfg, None)
        trainer.run()
        runs.append(trainer.algorithm)
    eager, captured = runs
    assert captured._captures is not None
    assert captured._captures.captured
    assert eager.gradient_steps == captured.gradient_steps
    for a, b in zip(_state(eager), _state(captured), strict=True):
        assert torch.equal(a.cpu(), b.cpu())


@CUDA
def test_a_captured_td3_step_with_a_non_finite_critic_loss_moves_nothing() -> None:
    trainer = make_trainer(
        _sac_config("cuda", algo="td3", cuda_graphs=True, nan_policy="skip_batch"), None
    )
    trainer.run()
    algorithm = trainer.algorithm
    assert algorithm._captures.captured
    before = [t.clone() for t in _state(algorithm)]
    steps = algorithm.gradient_steps
    trainer.buffer.rewards[:] = float("nan")
    algorithm.update(trainer.buffer, num_gradient_steps=4)  # both captures, twice each
    assert algorithm.skipped_batches == 4
    assert algorithm.gradient_steps == steps
    for a, b in zip(before, _state(algorithm), strict=True):
        assert torch.equal(a, b)
    algorithm.nan_policy = "raise"
    with pytest.raises(NonFiniteError, match="non-finite loss"):
        algorithm.update(trainer.buffer)


@pytest.mark.parametrize("algo", ["sac", "td3", "ddpg"])
def test_a_network_with_hooks_steps_eagerly(algo: str) -> None:
    """Hooks would run once, at the capture: while the actor or a critic has one, the update
    gets no captures."""
    algorithm = make_trainer(_sac_config("cpu", algo=algo), None).algorithm
    algorithm._captures = CapturedSteps(torch.device("cpu"))  # as capture_update sets them
    networks = algorithm.modules()
    actor, critic = networks["actor"], networks["critic"]
    assert algorithm._captures_for(actor, critic) is algorithm._captures
    handle = critic.register_forward_hook(lambda *_: None)
    assert algorithm._captures_for(actor, critic) is None
    handle.remove()
    assert algorithm._captures_for(actor, critic) is algorithm._captures


def test_captured_steps_hand_back_a_batch_that_does_not_fit_their_tensors() -> None:
    """A minibatch of another shape runs nothing captured (the caller steps it eagerly), and
    the kept batch is left as it was."""
    captures = CapturedSteps(torch.device("cpu"))
    captures.batch = to_static(_batch(4), torch.device("cpu"))  # as the first call keeps it

    def step(batch: Any) -> tuple[torch.Tensor, ...]:
        raise AssertionError("a batch that does not fit must not be stepped")

    assert captures(0, _batch(3, fill=7.0), step) is None
    assert not captures.captured
    assert bool((captures.batch.obs == 1.0).all())
