"""The public API of ``import rlfleet``: complete, sorted, and shadowing no subpackage."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import pytest

import rlfleet

PROMISED = {
    "PPO",
    "SAC",
    "DQN",
    "OnPolicyTrainer",
    "OffPolicyTrainer",
    "OfflineTrainer",
    "DecentralizedTrainer",
    "DistributedAgent",
    "make_vec_env",
    "load",
}


def test_the_promised_names_are_exported() -> None:
    assert set(rlfleet.__all__) >= PROMISED
    assert all(hasattr(rlfleet, name) for name in rlfleet.__all__)


def test_every_algorithm_is_exported() -> None:
    exported = {getattr(rlfleet, name) for name in rlfleet.__all__}
    for name in rlfleet.list_algorithms():
        assert rlfleet.get_algorithm(name) in exported, name


def test_no_exported_name_is_a_subpackage_or_module() -> None:
    submodules = {info.name for info in pkgutil.iter_modules(rlfleet.__path__)}
    assert submodules  # the walk found the package's modules
    assert not submodules & set(rlfleet.__all__)


def test_subpackages_import_after_the_package() -> None:
    code = "import rlfleet; import rlfleet.train.trainer as t; print(t.OnPolicyTrainer.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "OnPolicyTrainer"
    assert (
        importlib.import_module("rlfleet.train.trainer").OnPolicyTrainer is rlfleet.OnPolicyTrainer
    )


def test_all_is_sorted_as_ruff_sorts_it() -> None:
    def key(name: str) -> tuple[int, str]:
        kind = 0 if name.isupper() else 1 if name[:1].isupper() else 2
        return kind, name

    assert rlfleet.__all__ == sorted(rlfleet.__all__, key=key)


def _fresh(code: str) -> str:
    """What ``code`` prints in a fresh interpreter that imports this checkout's rlfleet."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return done.stdout.strip()


LAZY = ("torch", "numpy", "gymnasium", "pydantic", "pyarrow", "yaml", "tyro", "rich")
OPTIONAL = ("matplotlib", "pandas", "optuna", "ray", "tensorboard", "wandb")


def test_importing_the_package_imports_nothing_heavy() -> None:
    heavy = set(LAZY + OPTIONAL)
    imported = _fresh(
        f"import sys, rlfleet; print(*sorted({{m.split('.')[0] for m in sys.modules}} & {heavy!r}))"
    )
    assert imported == ""


def test_importing_the_package_imports_only_the_bottom_layer() -> None:
    # docs/architecture.md: "`import rlfleet` imports no torch and, of the layers, only
    # `rlfleet.errors` and `rlfleet.version`".
    ours = _fresh(
        "import sys, rlfleet; "
        "print(*sorted(m for m in sys.modules if m.split('.')[0] == 'rlfleet'))"
    )
    assert ours.split() == ["rlfleet", "rlfleet.errors", "rlfleet.version"]


IMPORTED_WHERE_USED = (
    "ray",
    "optuna",
    "tensorboard",
    "wandb",
    "onnx",
    "onnxruntime",
    "h5py",
    "ale_py",
    "cv2",
    "envpool",
    "minatar",
    "sqlalchemy",
    "matplotlib",
    "scipy",
    "torch._dynamo",
    "torch._inductor",
)
"""docs/architecture.md's list of third-party packages imported inside the function that uses
them (the compiler's parts of torch by their modules)."""


def test_no_module_imports_the_packages_its_functions_import() -> None:
    code = (
        "import importlib, pkgutil, sys, rlfleet\n"
        "names = [m.name for m in pkgutil.walk_packages(rlfleet.__path__, 'rlfleet.')]\n"
        "for name in names: importlib.import_module(name)\n"
        f"found = [m for m in {IMPORTED_WHERE_USED!r} if m in sys.modules]\n"
        "print(len(names), *found)"
    )
    count, *found = _fresh(code).split()
    assert int(count) > 100  # the walk found the whole library
    assert found == []


def test_the_names_import_on_first_use_and_stay() -> None:
    assert set(dir(rlfleet)) >= set(rlfleet.__all__)
    for name in rlfleet.__all__:
        value = getattr(rlfleet, name)
        assert vars(rlfleet)[name] is value
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = rlfleet.no_such_name  # type: ignore[attr-defined]


def test_a_submodule_import_alone_installs_the_training_backend() -> None:
    # `from rlfleet.algos.ppo import PPO` reaches the algorithms without any name of the root
    # package; the env form of the constructor still needs the backend installed.
    out = _fresh(
        "from rlfleet.algos.ppo import PPO; "
        "algo = PPO('CartPole-v1', num_steps=64); print(algo.config.num_steps)"
    )
    assert out == "64"
