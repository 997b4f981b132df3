"""Joining a cluster and refusing bad settings: no Ray cluster is started in this module but
the local one whose workers' priority a test checks."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlfleet.cli.main import main
from rlfleet.distributed import DistributedConfig
from rlfleet.distributed.cluster import LOCAL_SYSTEM_CONFIG, connect, parse_address, require_ray
from rlfleet.errors import ClusterError, ConfigError, MissingDependencyError
from rlfleet.runs.distributed_agent import DistributedAgent


def test_a_local_cluster_runs_its_workers_at_normal_priority() -> None:
    """Ray starts workers at niceness 15; a cluster rlfleet starts runs them at 0, as the
    learner, so other work on the machine does not starve the rollout actors."""
    ray = pytest.importorskip("ray")
    assert connect(None, local_num_cpus=1)
    try:

        @ray.remote(num_cpus=0)
        def niceness() -> int:
            return os.nice(0)

        assert ray.get(niceness.remote()) == os.nice(0) == 0
    finally:
        ray.shutdown()
    # Ray adds its session's settings to the dict it is given: the next cluster starts clean.
    assert dict(LOCAL_SYSTEM_CONFIG) == {"worker_niceness": 0}


def test_no_address_starts_a_new_local_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no address, ``ray.init`` joins a cluster that ``ray start`` left running on the
    machine, and then refuses ``num_cpus``: ``connect`` asks for a new local one."""
    calls: list[dict[str, object]] = []
    fake = SimpleNamespace(is_initialized=lambda: False, init=lambda **kw: calls.append(kw))
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert connect(None, local_num_cpus=3)
    assert calls[0]["address"] == "local"
    assert calls[0]["_system_config"] == {"worker_niceness": 0}


def test_missing_ray_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` raise ImportError
    with pytest.raises(MissingDependencyError, match=r"pip install 'rlfleet\[ray\]'"):
        require_ray()


@pytest.mark.parametrize("address", ["ray://127.0.0.1:1", "127.0.0.1:1"])
def test_unreachable_address_fails_within_seconds(address: str) -> None:
    pytest.importorskip("ray")
    start = time.perf_counter()
    with pytest.raises(ClusterError, match="cannot reach the Ray cluster at") as err:
        connect(address, local_num_cpus=1)
    assert time.perf_counter() - start < 10
    assert address in str(err.value)
    assert "ray start --head" in str(err.value)


@pytest.mark.parametrize("address", ["ray://", "localhost", "http://h:1", "host:port"])
def test_malformed_address_is_a_config_error(address: str) -> None:
    with pytest.raises(ConfigError, match="not a cluster address"):
        parse_address(address)


def test_parse_address() -> None:
    assert parse_address("ray://10.0.0.2:10001") == ("10.0.0.2", 10001)
    assert parse_address("head-node:6379") == ("head-node", 6379)


def test_cli_with_unreachable_address_exits_with_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("ray")
    start = time.perf_counter()
    code = main(
        [
            "train",
            "impala",
            "--env",
            "CartPole-v1",
            "--ray-address",
            "ray://127.0.0.1:1",
            "--run-dir",
            str(tmp_path / "run"),
        ]
    )
    assert code == 2
    assert time.perf_counter() - start < 20
    assert "cannot reach the Ray cluster at 'ray://127.0.0.1:1'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        ("127.0.0.1:1", ClusterError, "cannot reach the Ray cluster at '127.0.0.1:1'"),
        ("localhost", ConfigError, "'localhost' is not a cluster address"),
        ("auto", ClusterError, "cannot join the Ray cluster at 'auto'"),
    ],
)
def test_ray_address_in_the_environment_is_the_cluster_to_join(
    value: str, error: type[Exception], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no address given, ``RAY_ADDRESS`` names the cluster (as ``ray.init()`` reads it),
    and an error names the variable: an unreachable one is not replaced by a local cluster."""
    pytest.importorskip("ray")
    monkeypatch.setenv("RAY_ADDRESS", value)
    with pytest.raises(error, match=message) as err:
        connect(None, local_num_cpus=1)
    assert "RAY_ADDRESS environment variable" in str(err.value)


def test_cli_with_an_unreachable_ray_address_variable_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("ray")
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    run_dir = tmp_path / "run"
    code = main(["train", "impala", "--env", "CartPole-v1", "--run-dir", str(run_dir)])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "leave the RAY_ADDRESS environment variable unset" in err
    assert not run_dir.exists()


def test_num_actors_below_one_is_refused() -> None:
    with pytest.raises(ConfigError, match="num_actors"):
        DistributedAgent("CartPole-v1", num_actors=0)


def test_fewer_storages_than_actors_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"num_storages \(2\) must be >= num_actors \(4\)"):
        DistributedAgent("CartPole-v1", num_actors=4, num_storages=2)


def test_fewer_storages_than_a_learner_batch_is_refused() -> None:
    cfg = DistributedConfig(num_actors=1, num_learners=2, num_storages=2)
    with pytest.raises(ConfigError, match="batch_fragments x num_learners"):
        cfg.check(batch_fragments=2)


def test_default_storages_give_each_actor_two_requests() -> None:
    assert DistributedConfig(num_actors=3).storages == 6
    assert DistributedConfig(num_actors=3, requests_per_actor=1).storages == 3


def test_reserved_cpus_size_a_local_cluster() -> None:
    assert DistributedConfig(num_actors=4, actor_num_cpus=0.5).cpus_reserved == 2
    # A single learner runs in the driver and reserves nothing.
    assert DistributedConfig(num_actors=3, num_learners=1).cpus_reserved == 3
    assert DistributedConfig(num_actors=3, num_learners=2, learner_num_cpus=0.5).cpus_reserved == 4


def test_unknown_algorithm_keyword_is_refused() -> None:
    with pytest.raises(ConfigError, match="learning_rat"):
        DistributedAgent("CartPole-v1", learning_rat=0.1)


def test_distributed_settings_are_refused_for_ppo() -> None:
    from rlfleet.runs.config import default_run_config

    with pytest.raises(ConfigError, match="not to ppo"):
        default_run_config("ppo", "CartPole-v1", {"distributed": {"num_actors": 2}})
