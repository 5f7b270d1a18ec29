"""Joining a Ray cluster, or starting a local one, for the commands that run on Ray (``oasr transcribe
--ray-workers``, ``oasr serve --ray-replicas``). Ray is imported only when a command asks for it."""

from __future__ import annotations

import logging
import os
import signal
import threading

from oasr.errors import OASRError


class RayClusterError(OASRError):
    """Ray could not be started, or the cluster named could not be reached."""


def ray_available() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def connect(address: str | None, min_cpus: int, *, log_to_driver: bool = False,
            keep_signal_handlers: bool = False) -> bool:
    """Initialises Ray unless it already is: joins ``address`` (anything ``ray.init`` takes), or starts a local
    cluster with at least ``min_cpus`` logical CPUs (more when the machine has more cores). True when this call
    initialised Ray, so that the caller shuts it down again. ``log_to_driver``: the actors' logs come to this
    process's stderr. ``keep_signal_handlers``: the SIGINT and SIGTERM handlers stay the caller's (``ray.init``
    puts in a SIGTERM handler that exits with status 15 wherever the process is, a server's shutdown included)."""
    import ray

    if ray.is_initialized():
        return False
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)} \
        if keep_signal_handlers and threading.current_thread() is threading.main_thread() else {}
    handlers = {sig: handler for sig, handler in handlers.items() if handler is not None}  # None: not Python's
    try:
        return _init(address, min_cpus, log_to_driver)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def _init(address: str | None, min_cpus: int, log_to_driver: bool) -> bool:
    import ray

    quiet = {"log_to_driver": log_to_driver, "logging_level": logging.ERROR}
    try:
        if address is not None:
            ray.init(address=address, **quiet)
        else:
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
            ray.init(num_cpus=max(cores, min_cpus), include_dashboard=False, **quiet)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise RayClusterError(f"cannot start or reach Ray ({address or 'local'}): {exc}") from None
    return True
