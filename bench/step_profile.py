"""Where the time of a gradient step goes, against the arithmetic it must do.

Three workloads of the speed comparisons, each trained briefly in this process with the
comparison's identical-settings hyperparameters (``ppo_cartpole.py``, ``dqn_cartpole.py``,
``sac_pendulum.py``):

1. **Phases.** The run's wall time is split into collection (``Collector.collect_*``) and
   updates (``algo.update``); each update into minibatch sampling, backward
   (``loss.backward``, or ``PlainMLP.backward`` where the update writes its gradients
   out), optimiser (gradient clip, finite check, Adam step) and the rest:
   the forward passes, the loss and the Python between the kernels.
2. **FLOP floor.** The matrix arithmetic of one gradient step is counted with
   ``torch.utils.flop_counter.FlopCounterMode`` (forward and backward matmuls) and divided by
   the single-thread ``torch.mm`` rate measured at the network's hidden-layer shape: the
   time a gradient step would take if it were nothing but its matmuls at that rate. A torch
   profile of an update then splits the step into matmul kernels, other kernels (the
   largest named) and the rest: Python, dispatch and autograd's bookkeeping.
3. **Threads.** A gradient step and one act (batch ``num_envs``) timed at 1 and 2 torch
   threads, for the three workloads and for ``ppo_atari.py``'s Nature CNN at batch 256,
   with the count ``torch_threads: auto`` picks for each (:mod:`rlfleet.train.threads`).

(Not ``profile.py``: that name would shadow the standard library module torch imports.)
Results go to ``bench/results/profile.md`` and ``.parquet``. Timings on a shared machine
are rough: pass ``--note`` to say so in the report.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dqn_cartpole
import numpy as np
import ppo_atari
import ppo_cartpole
import pyarrow as pa
import pyarrow.parquet as pq
import sac_pendulum
import torch
from compare import QUIET, Comparison, identical_hyperparameters
from gymnasium import spaces
from harness import RESULTS, machine
from torch.utils.flop_counter import FlopCounterMode

from rlfleet.algos import dqn as dqn_module
from rlfleet.algos import ppo as ppo_module
from rlfleet.algos import sac as sac_module
from rlfleet.algos.ppo import PPO, PPOConfig
from rlfleet.data.rollout import RolloutStorage
from rlfleet.nn import optim
from rlfleet.nn.mlp_grad import PlainMLP
from rlfleet.runs.config import default_run_config
from rlfleet.runs.run import make_trainer
from rlfleet.train.threads import WORK_PER_THREAD, auto_torch_threads, update_work

WORKLOADS: dict[str, tuple[Comparison, int, tuple[int, int, int]]] = {
    # name: (comparison, env steps profiled, (batch, in, out) of the hidden matmul)
    "ppo_cartpole": (ppo_cartpole.SPEC, 25_600, (256, 64, 64)),
    "dqn_cartpole": (dqn_cartpole.SPEC, 9_000, (64, 256, 256)),
    "sac_pendulum": (sac_pendulum.SPEC, 1_200, (256, 256, 256)),
}
ALGO_MODULES = (ppo_module, dqn_module, sac_module)


class Clock:
    """Wall-time totals by phase."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.totals[name] = self.totals.get(name, 0.0) + time.perf_counter() - t0

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.phase(name):
                return fn(*args, **kwargs)

        return timed


def timed_optimizer_step(clock: Clock) -> Callable[..., Any]:
    """:func:`rlfleet.nn.optim.optimizer_step`, its backward and its step timed apart."""

    def optimizer_step(owner, optimizer, loss, params, *, max_grad_norm=None, inputs=None):  # type: ignore[no-untyped-def]
        with clock.phase("backward"):
            for p in params:
                p.grad = None
            loss.backward(inputs=inputs)
        with clock.phase("optimizer"):
            return optim.step_if_finite(owner, optimizer, loss, params, max_grad_norm=max_grad_norm)

    return optimizer_step


def build_trainer(spec: Comparison, steps: int, threads: int | None) -> Any:
    trainer_cfg = {
        **QUIET,
        "test_step_num_episodes": 1,
        "max_steps": steps,
        "epoch_num_steps": steps,
        "target_reward": None,
        "test_in_training": False,
    }
    overrides = {
        "seed": 0,
        "trainer": trainer_cfg,
        # As the comparison's identical setting: what it leaves out keeps the algorithm's
        # default, not the shipped preset's value for the env, and the envs step in the
        # vector mode `rlfleet train` picks.
        "hyperparameters": identical_hyperparameters(spec.algo, spec.rlfleet_hyperparameters),
        "env": {"num_envs": spec.num_envs},
        "torch_threads": threads,
    }
    return make_trainer(default_run_config(spec.algo, spec.env_id, overrides), None)


def mm_gflops(batch: int, inner: int, out: int, seconds: float = 0.3) -> float:
    """Single-thread ``torch.mm`` rate at ``[batch, inner] @ [inner, out]``, GFLOP/s."""
    with threads(1):
        a, b = torch.randn(batch, inner), torch.randn(inner, out)
        for _ in range(20):
            torch.mm(a, b)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for _ in range(50):
                torch.mm(a, b)
            n += 50
        return 2 * batch * inner * out * n / (time.perf_counter() - t0) / 1e9


@contextlib.contextmanager
def threads(count: int) -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def one_update(trainer: Any, steps: int = 1) -> Callable[[], Any]:
    """An update of ``steps`` gradient steps on the trainer's data, as its update step takes
    them (on-policy: one epoch per gradient step, each on the whole rollout)."""
    algo = trainer.learner
    if hasattr(trainer, "storage"):
        size = trainer.storage.num_steps * trainer.storage.num_envs
        return lambda: algo.update(trainer.storage, batch_size=size, num_repetitions=steps)
    return lambda: algo.update(trainer.buffer, num_gradient_steps=steps)


def top_level_ops(fn: Callable[[], Any]) -> int:
    """Operators ``fn`` dispatches from Python, and autograd nodes its backward runs: the
    events of a torch profile that no other event encloses."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return sum(1 for event in prof.events() if event.cpu_parent is None)


MATMULS = frozenset(
    {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::mkldnn_convolution"}
)
"""The matrix-product kernels (what the FLOP floor counts)."""


def kernel_split(trainer: Any, step_ms: float, steps: int = 20) -> dict[str, Any]:
    """Of a gradient step of ``step_ms``, the time inside matmul kernels and inside other
    kernels, and the other kernel that takes longest: the self time of aten operators in a
    torch profile of an update of ``steps`` steps (1 thread), as shares of that update's
    wall time, applied to ``step_ms`` (profiling slows every operator alike, by about a
    microsecond). The rest of a step is Python, dispatch and autograd's bookkeeping."""
    update = one_update(trainer, steps)
    with threads(1):
        update()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            update()
            profiled_us = (time.perf_counter() - t0) * 1e6
    matmul = 0.0
    others: dict[str, float] = {}
    for event in prof.key_averages():
        if not event.key.startswith("aten::"):
            continue
        if event.key in MATMULS:
            matmul += event.self_cpu_time_total
        else:
            others[event.key] = event.self_cpu_time_total
    top = max(others, key=others.__getitem__)
    scale = step_ms / profiled_us  # profiler times are in µs
    return {
        "matmul_kernels_ms": matmul * scale,
        "other_kernels_ms": sum(others.values()) * scale,
        "top_other_kernel": top,
        "top_other_kernel_ms": others[top] * scale,
    }


def ops_per_step(trainer: Any) -> int:
    """Top-level ops of one gradient step: an update of two steps minus an update of one
    (what an update does once, such as GAE or the logged statistics, cancels)."""
    return top_level_ops(one_update(trainer, 2)) - top_level_ops(one_update(trainer, 1))


def matmul_flops(step: Callable[[], Any]) -> int:
    counter = FlopCounterMode(display=False)
    with counter:
        step()
    return int(counter.get_total_flops())


def call_times_ms(fn: Callable[[], Any], seconds: float) -> list[float]:
    """Times of single calls of ``fn`` (after one warm-up call) for about ``seconds``, in ms."""
    fn()
    times: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 3:
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def profile_workload(name: str) -> tuple[dict[str, Any], dict[str, Callable[[], Any]]]:
    spec, steps, shape = WORKLOADS[name]
    trainer = build_trainer(spec, steps, threads=1)
    clock = Clock()
    algo = trainer.learner
    collector = trainer.collector
    collector.collect_rollout = clock.wrap("collection", collector.collect_rollout)
    collector.collect_transitions = clock.wrap("collection", collector.collect_transitions)
    update = algo.update
    algo.update = clock.wrap("update", update)
    originals = {m: m.optimizer_step for m in ALGO_MODULES}
    # An update that writes its gradients out (DQN's PlainMLP) steps without optimizer_step.
    written_out: list[tuple[Any, str, Any]] = [
        (PlainMLP, "backward", PlainMLP.backward),
        *(
            (m, "step_if_finite", m.step_if_finite)
            for m in ALGO_MODULES
            if hasattr(m, "step_if_finite")
        ),
    ]
    sampling: list[tuple[Any, str, Any]] = []
    if hasattr(trainer, "buffer"):
        sampling.append((trainer.buffer, "sample", trainer.buffer.sample))
    else:
        sampling.append((ppo_module, "rollout_minibatches", ppo_module.rollout_minibatches))
    try:
        for m in ALGO_MODULES:
            m.optimizer_step = timed_optimizer_step(clock)
        for owner, attr, fn in sampling:
            setattr(owner, attr, clock.wrap("sampling", fn))
        for owner, attr, fn in written_out:
            setattr(owner, attr, clock.wrap("backward" if attr == "backward" else "optimizer", fn))
        t0 = time.perf_counter()
        trainer.run()
        wall = time.perf_counter() - t0
    finally:
        for m, fn in originals.items():
            m.optimizer_step = fn
        for owner, attr, fn in [*sampling, *written_out]:
            setattr(owner, attr, fn)
        algo.update = update
    grad_steps = algo.gradient_steps
    totals = clock.totals
    step_ms = {
        k: totals.get(k, 0.0) / grad_steps * 1e3 for k in ("sampling", "backward", "optimizer")
    }
    update_ms = totals["update"] / grad_steps * 1e3
    step_ms["forward+python"] = update_ms - sum(step_ms.values())
    flops = matmul_flops(one_update(trainer))
    ops = ops_per_step(trainer)
    kernels = kernel_split(trainer, update_ms)
    rate = mm_gflops(*shape)
    floor_ms = flops / rate / 1e6
    row = {
        "workload": name,
        "env_steps": trainer.counters.env_step,
        "gradient_steps": grad_steps,
        "wall_s": wall,
        "collection_s": totals.get("collection", 0.0),
        "update_s": totals["update"],
        "update_ms_per_step": update_ms,
        **{f"{k}_ms": v for k, v in step_ms.items()},
        "mflop_per_step": flops / 1e6,
        "mm_gflops": rate,
        "floor_ms": floor_ms,
        "ops_per_step": ops,
        "us_per_op_above_floor": (update_ms - floor_ms) * 1e3 / ops,
        **kernels,
    }
    collector_obs = collector.obs

    def act() -> None:
        with torch.inference_mode():
            algo.act(algo.preprocess(torch.as_tensor(np.asarray(collector_obs))))

    return row, {"update": one_update(trainer), "act": act, "trainer": lambda: trainer}


def cnn_workload() -> dict[str, Callable[[], Any]]:
    """``ppo_atari.py``'s network (Nature CNN, linear heads) at batch 256."""
    hp = ppo_atari.HYPERPARAMETERS
    obs_space = spaces.Box(0, 255, (4, 84, 84), np.uint8)
    algo = PPO(
        obs_space,
        spaces.Discrete(6),
        PPOConfig(hidden_sizes=(), cnn="nature", batch_size=int(hp["batch_size"])),
    )
    storage = RolloutStorage(32, 8, algo.obs_layout.shape, (), action_dtype=torch.int64)
    generator = torch.Generator().manual_seed(0)
    storage.obs.copy_(torch.randint(0, 256, storage.obs.shape, generator=generator))
    storage.rewards.uniform_(0, 1, generator=generator)
    storage.valid.fill_(1)
    step = algo.act(storage.obs.reshape(256, *obs_space.shape))
    storage.actions.copy_(step.actions.reshape(32, 8))
    assert step.log_probs is not None
    assert step.values is not None
    storage.log_probs.copy_(step.log_probs.reshape(32, 8))
    storage.values.copy_(step.values.reshape(32, 8))
    obs8 = storage.obs[0]
    return {
        "update": lambda: algo.update(storage, batch_size=256, num_repetitions=1),
        "act": lambda: algo.act(obs8),
        "algo": lambda: algo,
    }


def thread_rows(
    cases: dict[str, dict[str, Callable[[], Any]]], seconds: float, rounds: int = 3
) -> list[dict[str, Any]]:
    """Per workload and thread count, the fastest and the median single call of an update
    and of an act, the counts alternating ``rounds`` times so that load hits both alike.

    The fastest call estimates the time on an idle machine (no other process competing for
    a core); the median, the time under the load the machine had."""
    rows = []
    for name, case in cases.items():
        times: dict[str, list[float]] = {}
        for _ in range(rounds):
            for count in (1, 2):
                with threads(count):
                    for what in ("update", "act"):
                        key = f"{what}_{count}t"
                        share = seconds / rounds / (1 if what == "update" else 2)
                        times.setdefault(key, []).extend(call_times_ms(case[what], share))
        row: dict[str, Any] = {"workload": name}
        for key, values in times.items():
            row[f"{key}_min_ms"] = min(values)
            row[f"{key}_median_ms"] = statistics.median(values)
        rows.append(row)
    return rows


def auto_choice(algo: Any) -> tuple[int, float]:
    work = update_work(algo)
    return auto_torch_threads(algo), work


def bound(r: dict[str, Any]) -> str:
    """What the figures say bounds a workload's gradient step."""
    step = r["update_ms_per_step"]
    ratio = step / r["floor_ms"]
    collection = r["collection_s"] / r["wall_s"]
    matmul, other = r["matmul_kernels_ms"], r["other_kernels_ms"]
    rest = max(step - matmul - other, 0.0)
    top, top_ms = r["top_other_kernel"], r["top_other_kernel_ms"]
    text = (
        f"{step:.2f} ms per gradient step is {ratio:.1f}x its matmul floor of "
        f"{r['floor_ms']:.2f} ms; collection is {collection:.0%} of the run. Of the step, "
        f"matmul kernels take {matmul:.2f} ms ({matmul / step:.0%}), other kernels "
        f"{other:.2f} ms ({other / step:.0%}; the largest, `{top}`, {top_ms:.3f} ms), and "
        f"the rest, {rest:.2f} ms ({rest / step:.0%}), is Python, dispatch and autograd's "
        f"bookkeeping around {r['ops_per_step']} operators. "
    )
    largest = max(("matmul", matmul), ("other", other), ("rest", rest), key=lambda x: x[1])[0]
    if largest == "rest":
        return text + (
            "Eager dispatch, not the maths, bounds it: only fewer operators close this "
            "(fusing the update: `torch.compile`, CUDA graphs on a GPU); faster kernels or "
            "more threads do not."
        )
    if largest == "matmul":
        return text + (
            "The matmuls bound it: less time needs more cores on them (threads, on an idle "
            "machine) or cheaper arithmetic (bf16); fewer operators would gain at most the "
            f"{rest / step:.0%}."
        )
    return text + (
        f"Kernels other than matmuls take the largest share: `{top}` alone "
        f"{top_ms / step:.0%} of the step (a faster kernel for it would pay that much at "
        "most), the rest many small elementwise kernels, each with a fixed cost per call "
        "that only fewer operators (fusing the update) would cut."
    )


def render(phases: list[dict[str, Any]], thread_table: list[dict[str, Any]], note: str) -> str:
    lines = [
        f"# Where a gradient step's time goes ({time.strftime('%Y-%m-%d')})",
        "",
        "Generated by `bench/step_profile.py`. Each workload trains in one process at 1 torch "
        "thread with the identical-settings hyperparameters of its speed comparison, for "
        "a short budget; its wall time is split by phase. The FLOP floor is the matmul "
        "arithmetic of one gradient step (forward and backward, counted by "
        "`torch.utils.flop_counter.FlopCounterMode`) at the single-thread `torch.mm` rate "
        "measured at the network's hidden-layer shape.",
        "",
        f"Machine: {machine()}.",
        "",
    ]
    if note:
        lines += [f"**{note}**", ""]
    lines += [
        "## Phases of a training run (1 thread)",
        "",
        "| workload | env steps | gradient steps | wall s | collection s | updates s |",
        "|---|---|---|---|---|---|",
    ]
    for r in phases:
        lines.append(
            f"| {r['workload']} | {r['env_steps']:,} | {r['gradient_steps']:,} | "
            f"{r['wall_s']:.2f} | {r['collection_s']:.2f} | {r['update_s']:.2f} |"
        )
    lines += [
        "",
        "## One gradient step against its FLOP floor (1 thread)",
        "",
        "| workload | per step, ms | sampling | forward + Python | backward | optimiser | "
        "MFLOP (matmul) | mm GFLOP/s | floor, ms | step / floor | ops per step | "
        "µs per op above the floor |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in phases:
        lines.append(
            f"| {r['workload']} | {r['update_ms_per_step']:.3f} | {r['sampling_ms']:.3f} | "
            f"{r['forward+python_ms']:.3f} | {r['backward_ms']:.3f} | "
            f"{r['optimizer_ms']:.3f} | {r['mflop_per_step']:.1f} | {r['mm_gflops']:.1f} | "
            f"{r['floor_ms']:.3f} | {r['update_ms_per_step'] / r['floor_ms']:.1f}x | "
            f"{r['ops_per_step']} | {r['us_per_op_above_floor']:.1f} |"
        )
    lines += [
        "",
        "Sampling: drawing the minibatch (the replay buffer's `sample`; on-policy, cutting "
        "the rollout). Backward: `loss.backward()`; DQN's, `PlainMLP.backward` (its "
        "gradients written out; the loss's own gradient is in forward + Python). Optimiser: "
        "gradient clip, finite check "
        "and Adam. Forward + Python: the rest of the update, i.e. the forward passes, the "
        "losses and the Python between the kernels. Ops per step: the operators dispatched "
        "from Python plus the autograd nodes of the backward (top-level events of a torch "
        "profile; an update of two steps minus one of one step).",
        "",
        "## What bounds the remaining gap",
        "",
    ]
    for r in phases:
        lines += [f"- **{r['workload']}**: {bound(r)}"]
    lines += [
        "",
        "## Threads: 1 against 2, and what `torch_threads: auto` picks",
        "",
        "One update on one minibatch (`step`) and one act on a batch of `num_envs` "
        "observations (`act`), timed call by call, 1 and 2 threads alternating. `fastest` "
        "estimates an idle machine (no other process competing for a core); `median` is "
        "what the machine's load at the time gave. `auto` gives one thread per "
        f"{WORK_PER_THREAD / 1e6:.0f}M multiply-accumulates of update work, at most the "
        "cores (`rlfleet.train.threads.auto_torch_threads`).",
        "",
        "| workload | update work (MAC) | step, 1 thread: fastest / median ms | "
        "step, 2 threads | act, 1 thread | act, 2 threads | auto picks |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in thread_table:
        cells = [
            f"{r[f'{what}_{n}t_min_ms']:.3f} / {r[f'{what}_{n}t_median_ms']:.3f}"
            for what in ("update", "act")
            for n in (1, 2)
        ]
        lines.append(
            f"| {r['workload']} | {r['work']:,.0f} | {cells[0]} | {cells[1]} | {cells[2]} | "
            f"{cells[3]} | {r['auto']} |"
        )
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--seconds", type=float, default=1.5, help="timing window per figure")
    parser.add_argument("--note", default="", help="a line for the report (e.g. machine load)")
    parser.add_argument("--out", default=str(RESULTS / "profile"), help="results path stem")
    args = parser.parse_args()
    # As the trainer computes: subnormal floats flushed to zero (see rlfleet.train.loop).
    torch.set_flush_denormal(True)

    phases, cases, autos = [], {}, {}
    for name in args.workloads:
        row, case = profile_workload(name)
        print(row, flush=True)
        phases.append(row)
        cases[name] = case
        autos[name] = auto_choice(case["trainer"]().learner)
    cnn = cnn_workload()
    cases["ppo_atari_cnn_b256"] = cnn
    autos["ppo_atari_cnn_b256"] = auto_choice(cnn["algo"]())
    table = thread_rows(cases, args.seconds)
    for row in table:
        row["auto"], row["work"] = autos[row["workload"]]
        print(row, flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(render(phases, table, args.note))
    pq.write_table(pa.Table.from_pylist(phases), out.with_suffix(".parquet"))
    pq.write_table(pa.Table.from_pylist(table), out.with_name(out.name + "_threads.parquet"))
    print(f"wrote {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
