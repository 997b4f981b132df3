"""Joining or starting the Ray cluster, with errors that say what to do.

Ray is an optional dependency: nothing here imports it until a distributed run starts.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from types import MappingProxyType, ModuleType
from urllib.parse import urlsplit

from rlfleet.errors import ClusterError, ConfigError, MissingDependencyError, option

INSTALL_HINT = "pip install 'rlfleet[ray]'"
ADDRESS_VARIABLE = "RAY_ADDRESS"
"""Ray's environment variable naming the cluster to join when no address is given."""
REACH_TIMEOUT_S = 5.0
"""How long to try to open a TCP connection to a cluster address before giving up."""
LOCAL_SYSTEM_CONFIG: Mapping[str, object] = MappingProxyType({"worker_niceness": 0})
"""Ray settings of a cluster started on this machine (pass a copy: ``ray.init`` adds its
session's own settings to the dict it is given). Ray starts its workers at niceness 15,
as background work; here they are the rollout actors, the work itself. Niced, they get almost
no CPU while anything else on the machine is busy: beside two CPU-bound processes on 2 cores,
a rollout actor did not finish starting within 120 s, where at niceness 0 the whole short run
it was for took 57 s."""


def local_cluster_settings() -> dict[str, object]:
    """The ``ray.init`` settings of every cluster started on this machine, a new dict each call
    (``ray.init`` adds its session's own settings to the one it is given): a new cluster even
    where ``ray start`` left one running (``address="local"``; with no address Ray would join
    that one), its workers at normal priority (:data:`LOCAL_SYSTEM_CONFIG`)."""
    return {"address": "local", "_system_config": dict(LOCAL_SYSTEM_CONFIG)}


def require_ray() -> ModuleType:
    """The ``ray`` module, or a MissingDependencyError with the install command."""
    try:
        import ray
    except ImportError as err:
        raise MissingDependencyError(
            f"distributed training (IMPALA, APPO) needs Ray, which is not installed: {INSTALL_HINT}"
        ) from err
    return ray


def connect(address: str | None, *, local_num_cpus: int) -> bool:
    """Join the cluster at ``address``, or at ``RAY_ADDRESS`` when it is None and that
    environment variable is set (as ``ray.init()`` reads it), or else start a local one.

    A session that is already connected (``ray.init`` called by the user or a test) is
    reused as it is. Returns True when this call connected, so the caller knows to
    ``ray.shutdown()`` at the end.

    An explicit ``HOST:PORT`` or ``ray://HOST:PORT`` is probed with a plain TCP connection
    first: Ray itself retries an unreachable address for a minute or more, a probe fails in
    seconds with a message that says how to start a cluster.
    """
    ray = require_ray()
    if ray.is_initialized():
        return False
    quiet = {"include_dashboard": False, "logging_level": logging.WARNING}
    setting = "ray_address"
    if address is None and os.environ.get(ADDRESS_VARIABLE):
        address = os.environ[ADDRESS_VARIABLE]
        setting = f"the {ADDRESS_VARIABLE} environment variable"
    if address is None:
        # Logical CPUs, not cores: actors that step cheap envs oversubscribe a laptop well,
        # and asking for more actors than cores must not leave them unscheduled forever.
        ray.init(
            num_cpus=max(os.cpu_count() or 1, local_num_cpus),
            **local_cluster_settings(),
            **quiet,
        )
        return True
    if address != "auto":
        _probe(address, setting)
    try:
        if address.startswith("ray://"):
            ray.init(address=address, logging_level=logging.WARNING)
        else:
            ray.init(address=address, **quiet)
    except (ConnectionError, TimeoutError, RuntimeError, ValueError) as err:
        origin = "" if setting == "ray_address" else f" (from {setting})"
        raise ClusterError(f"cannot join the Ray cluster at {address!r}{origin}: {err}") from None
    return True


def _probe(address: str, setting: str) -> None:
    host, port = parse_address(address, setting)
    try:
        with socket.create_connection((host, port), timeout=REACH_TIMEOUT_S):
            pass
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise ClusterError(
            f"cannot reach the Ray cluster at {address!r}: {reason} (after at most "
            f"{REACH_TIMEOUT_S:.0f} s). Start one with `ray start --head` and pass the address "
            f"it prints, or leave {_named(setting)} unset to start a local cluster"
        ) from None


def parse_address(address: str, setting: str = "ray_address") -> tuple[str, int]:
    """``(host, port)`` of ``HOST:PORT`` or ``ray://HOST:PORT``; ConfigError otherwise,
    naming ``setting``, where the address came from."""
    expected = "expected 'auto', 'ray://HOST:PORT' (Ray client) or 'HOST:PORT' (GCS)"
    parts = urlsplit(address if "://" in address else f"gcs://{address}")
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("ray", "gcs") or not parts.hostname or port is None:
        raise ConfigError(f"{setting} {address!r} is not a cluster address: {expected}")
    return parts.hostname, port


def _named(setting: str) -> str:
    """``setting`` as a message names it: the option (a flag on the command line) or the
    environment variable as it is."""
    return option(setting, None) if setting == "ray_address" else setting
