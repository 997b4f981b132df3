"""Every ```python block of README.md and docs/*.md runs, and so does every ```bash block of
``rlfleet`` commands and every script in examples/, so a broken example fails the suite.

How a block runs: in this process (torch and the envs are imported once for all blocks), in a
fresh namespace, with a fresh temporary directory as the working directory, so what it writes
(``runs/``, ``data/``, ``studies/``) lands there.

Examples keep realistic budgets, which a reader can copy as they are; the test caps them
instead, for every block alike (see :func:`_capped_budgets`): trainers stop after
``MAX_STEPS`` steps (multi-agent ones after ``MAX_EPISODES`` episodes), a search after
``MAX_TRIALS`` single-seed trials in this process, a distributed run uses ``MAX_ACTORS``
actors.

A block may declare what it needs in an HTML comment (invisible on the rendered page) on the
line right before its opening fence::

    <!-- docs-test: setup=pendulum_replay_buffer needs=ray runs=2 -->

``setup=NAME``: the function ``NAME`` in :data:`SETUPS` prepares the working directory first
(e.g. writes a file the example loads, as the reader's own would be). ``needs=MODULE,...``:
the block is skipped where that optional dependency is not installed (the dev extras install
them all, so they run in ``make test``). ``runs=N``: the block runs N times in the same
directory, each in a fresh namespace (an example a reader may well run again must not fail
the second time).

``commands=rlfleet`` marks a ```bash block of ``rlfleet`` commands (or ``python -m
rlfleet``): they run one after the other, in one working directory, through the entry point
in this process, with the same budget caps, and each must exit 0 (a line ending in a backslash
continues on the next, as in a shell). Blocks of the same commands with the same setup (a
page repeating the README's example) run once. Every other ```bash block says why it does not
run, with ``skip=REASON`` and a reason of :data:`SKIP_REASONS`: it installs software, or it
needs machines the suite does not have.

``ruff format --check .`` formats the same blocks (ruff formats Markdown code blocks), so
they stay formatted as well as runnable.
"""

from __future__ import annotations

import dataclasses
import re
import runpy
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlfleet.tune
import rlfleet.tune.study
from rlfleet.cli.main import main
from rlfleet.data.replay import ReplayBuffer
from rlfleet.envs.make import make_vec_env
from rlfleet.marl.trainer import DecentralizedTrainer
from rlfleet.runs.distributed_agent import DistributedAgent
from rlfleet.train.loop import TrainingLoop

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MAX_STEPS = 1_024
"""Env steps (offline: gradient steps) a trainer takes at most, in epochs of at most this."""
TEST_EPISODES = 1
"""Episodes per test step at most."""
MAX_EPISODES = 40
"""Training episodes of a multi-agent run at most."""
MAX_TRIALS = 2
"""Trials of a hyperparameter search at most (one seed each, one worker)."""
MAX_ACTORS = 1
"""Rollout actors of a distributed run at most."""
_DIRECTIVE = re.compile(r"<!--\s*docs-test:(?P<body>.*?)-->")


@dataclass(frozen=True)
class Block:
    """One ```python block of a page."""

    page: Path
    line: int
    """Line of the opening fence (1-based)."""
    code: str
    setup: str | None
    needs: tuple[str, ...]
    runs: int
    commands: str | None = None
    """``rlfleet``: a ```bash block of ``rlfleet`` (or ``python -m rlfleet``) commands."""
    skip: str | None = None
    """Why a ```bash block does not run (a key of :data:`SKIP_REASONS`)."""

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def python_blocks(page: Path, fence: str = "```python") -> list[Block]:
    """The page's ```python blocks (or other ``fence``), with the directive of the line
    before each."""
    lines = page.read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != fence:
            i += 1
            continue
        indent = len(lines[i]) - len(lines[i].lstrip())
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        code = "\n".join(line[indent:] for line in lines[i + 1 : end]) + "\n"
        options = _directive(lines[i - 1] if i else "", f"{page.name}:{i + 1}")
        blocks.append(
            Block(
                page,
                i + 1,
                code,
                options.get("setup"),
                tuple(filter(None, options.get("needs", "").split(","))),
                int(options.get("runs", "1")),
                options.get("commands"),
                options.get("skip"),
            )
        )
        i = end + 1
    return blocks


def _directive(line: str, where: str) -> dict[str, str]:
    match = _DIRECTIVE.search(line)
    if match is None:
        return {}
    options = dict(item.split("=", 1) for item in match["body"].split())
    unknown = set(options) - {"setup", "needs", "runs", "commands", "skip"}
    assert not unknown, f"{where}: unknown docs-test option(s) {sorted(unknown)}"
    return options


SKIP_REASONS = {
    "install": "installs software or runs this suite itself (`make`, `pip install`)",
    "cluster": "needs a multi-node Ray cluster or a database server",
}
"""Why a ```bash block may be left unrun; any other block of a page runs."""


# ------------------------------------------------------------------ setups
def pendulum_replay_buffer(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``buffer.npz``: a saved replay buffer of random Pendulum-v1 transitions."""
    envs = make_vec_env("Pendulum-v1", 4, seed=0)
    buffer = ReplayBuffer(2_000, envs.single_observation_space, envs.single_action_space, 4)
    obs, _ = envs.reset(seed=0)
    valid = np.ones(4, dtype=bool)
    for _ in range(300):
        actions = envs.action_space.sample()
        next_obs, rewards, terminated, truncated, _ = envs.step(actions)
        buffer.add(obs, actions, rewards, terminated, truncated, valid)
        obs, valid = next_obs, ~(terminated | truncated)
    envs.close()
    buffer.save(workdir / "buffer.npz")


_MY_ENV = """\
import gymnasium as gym
import numpy as np


class MyEnv(gym.Env):
    \"\"\"Push a point on a line back to 0: +1 a step while it is within 0.5 of it.\"\"\"

    observation_space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x, self.t = self.np_random.uniform(-1.0, 1.0), 0
        return np.array([self.x], np.float32), {}

    def step(self, action):
        self.x = float(np.clip(self.x + (0.1 if action else -0.1), -2.0, 2.0))
        self.t += 1
        reward = 1.0 if abs(self.x) < 0.5 else 0.0
        return np.array([self.x], np.float32), reward, False, self.t >= 100, {}
"""


def my_env_package(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``mypackage.envs:MyEnv``: an env class in a package on the import path, as the
    reader's own installed package would be."""
    package = workdir / "mypackage"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "envs.py").write_text(_MY_ENV)
    monkeypatch.syspath_prepend(str(workdir))


def cartpole_run_options(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``cartpole.yaml``: the run options example of docs/run-options.md (its first ```yaml
    block), so the README runs the file that page documents."""
    blocks = python_blocks(ROOT / "docs" / "run-options.md", "```yaml")
    (workdir / "cartpole.yaml").write_text(blocks[0].code)


SETUPS: dict[str, Callable[[Path, pytest.MonkeyPatch], None]] = {
    "pendulum_replay_buffer": pendulum_replay_buffer,
    "my_env_package": my_env_package,
    "cartpole_run_options": cartpole_run_options,
}


# ------------------------------------------------------------------ budgets
@pytest.fixture
def _capped_budgets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cap every training budget an example asks for (see the module docstring)."""
    reset = TrainingLoop._reset

    def capped_reset(self: TrainingLoop[Any, Any], *args: Any) -> None:
        # Every training session starts here: run(), reset(), execute_epoch(), iteration.
        cfg = self.config
        self.config = dataclasses.replace(
            cfg,
            max_steps=min(cfg.max_steps, MAX_STEPS),
            max_episodes=(
                min(cfg.max_episodes or MAX_EPISODES, MAX_EPISODES)
                if isinstance(self, DecentralizedTrainer)
                else cfg.max_episodes
            ),
            epoch_num_steps=min(cfg.epoch_num_steps, MAX_STEPS),
            test_step_num_episodes=min(cfg.test_step_num_episodes or TEST_EPISODES, TEST_EPISODES),
        )
        reset(self, *args)

    monkeypatch.setattr(TrainingLoop, "_reset", capped_reset)

    tune = rlfleet.tune.study.tune

    def capped_tune(algo: str, env_id: str, config: Any = None) -> Any:
        config = config or rlfleet.tune.TuneConfig()
        small = dataclasses.replace(config, trials=min(config.trials, MAX_TRIALS), seeds=1, jobs=1)
        return tune(algo, env_id, small)

    monkeypatch.setattr(rlfleet.tune, "tune", capped_tune)
    monkeypatch.setattr(rlfleet.tune.study, "tune", capped_tune)

    init_agent = DistributedAgent.__init__

    def capped_agent(self: DistributedAgent, *args: Any, **kwargs: Any) -> None:
        kwargs["num_actors"] = min(kwargs.get("num_actors", MAX_ACTORS), MAX_ACTORS)
        init_agent(self, *args, **kwargs)

    monkeypatch.setattr(DistributedAgent, "__init__", capped_agent)


# -------------------------------------------------------------------- tests
BLOCKS = [block for page in PAGES for block in python_blocks(page)]
BASH_BLOCKS = [block for page in PAGES for block in python_blocks(page, "```bash")]


def _command_lines(block: Block) -> list[str]:
    """A command block's lines, a line ending in a backslash joined to the next."""
    return block.code.replace("\\\n", " ").splitlines()


def _commands(block: Block) -> tuple[tuple[str, ...], ...]:
    """What a command block runs: its command lines without comments, and its setup."""
    words = [tuple(shlex.split(line, comments=True)) for line in _command_lines(block)]
    return (*filter(None, words), (block.setup or "",))


def _once(blocks: list[Block]) -> list[Block]:
    """The command blocks of ``blocks``, each set of commands once (its first block)."""
    kept: dict[tuple[tuple[str, ...], ...], Block] = {}
    for block in blocks:
        if block.commands == "rlfleet":
            kept.setdefault(_commands(block), block)
    return list(kept.values())


COMMAND_BLOCKS = _once(BASH_BLOCKS)
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def test_every_page_with_python_examples_is_found() -> None:
    # A parser that silently found nothing would let every example go untested.
    pages = {block.page.name for block in BLOCKS}
    assert {"README.md", "multi-agent.md", "off-policy.md", "offline.md"} <= pages
    assert {script.name for script in EXAMPLES} >= {"ppo_with_hooks.py"}


def test_directives_name_known_setups() -> None:
    for block in [*BLOCKS, *BASH_BLOCKS]:
        assert block.setup is None or block.setup in SETUPS, block.name


def test_every_bash_block_runs_or_says_why_not() -> None:
    # The pages' promise is that their examples run; a ```bash block nobody marked would
    # silently stay untested.
    for block in BASH_BLOCKS:
        assert (block.commands == "rlfleet") != (block.skip in SKIP_REASONS), (
            f"{block.name}: mark it `commands=rlfleet` (it then runs) or `skip=REASON` with a "
            f"reason of {sorted(SKIP_REASONS)}, not both"
        )


@pytest.mark.usefixtures("_capped_budgets")
@pytest.mark.parametrize("block", BLOCKS, ids=[block.name for block in BLOCKS])
def test_python_block_runs(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for module in block.needs:
        pytest.importorskip(module)
    monkeypatch.chdir(tmp_path)
    if block.setup is not None:
        SETUPS[block.setup](tmp_path, monkeypatch)
    code = compile(block.code, block.name, "exec")
    for _ in range(block.runs):
        exec(code, {"__name__": "__main__"})


def test_the_cli_page_has_command_blocks() -> None:
    assert {block.page.name for block in COMMAND_BLOCKS} >= {"cli.md"}


@pytest.mark.usefixtures("_capped_budgets")
@pytest.mark.parametrize("block", COMMAND_BLOCKS, ids=[block.name for block in COMMAND_BLOCKS])
def test_command_block_runs(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each line of a ```bash block marked ``commands=rlfleet`` runs, in order and in one
    working directory, through the ``rlfleet`` entry point in this process, and exits 0."""
    for module in block.needs:
        pytest.importorskip(module)
    monkeypatch.chdir(tmp_path)
    if block.setup is not None:
        SETUPS[block.setup](tmp_path, monkeypatch)
    try:
        for line in _command_lines(block):
            _run_command(block, line)
    finally:
        # Forget what the block imported from its working directory (a setup's package),
        # so a later block's setup of the same name is imported afresh.
        for name, module in list(sys.modules.items()):
            if str(getattr(module, "__file__", None) or "").startswith(str(tmp_path)):
                del sys.modules[name]


@pytest.mark.usefixtures("_capped_budgets")
@pytest.mark.parametrize("script", EXAMPLES, ids=[script.name for script in EXAMPLES])
def test_example_script_runs(script: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``python examples/NAME.py`` runs as a script, with its default arguments and the same
    budget caps, in a fresh working directory."""
    if "DistributedAgent" in script.read_text():
        pytest.importorskip("ray")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(script)])
    runpy.run_path(str(script), run_name="__main__")


def _run_command(block: Block, line: str) -> None:
    words = shlex.split(line, comments=True)
    if not words:
        return
    prefix = 3 if words[:3] == ["python", "-m", "rlfleet"] else 1
    assert words[0] == "rlfleet" or prefix == 3, f"{block.name}: not an rlfleet command"
    try:
        code = main(words[prefix:])
    except SystemExit as stop:  # tyro ends --help and completion this way
        code = stop.code if isinstance(stop.code, int) else 0
    assert code == 0, f"{block.name}: `{line}` exited with {code}"
