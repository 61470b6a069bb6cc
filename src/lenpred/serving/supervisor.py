"""Process supervisor for local servers (``vllm serve``, ``lenpred serve``): refuses a busy loopback port, starts
each command as its own process group (optionally pinned to CPUs) with its output in a log file, waits until its
health URL answers, and stops every group on exit, on errors and (with :func:`exit_on_sigterm`) on SIGTERM.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from lenpred.errors import LenpredError

LOOPBACK = "127.0.0.1"


def parse_cpu_set(spec: str | None, name: str = "cpus") -> set[int] | None:
    """CPU ids from ``"0"``, ``"0,2"`` or ``"0-3"``; ``None`` stays ``None``.

    Args:
        spec: the CPU list.
        name: what the list is called in error messages (e.g. the option that gave it).

    Raises:
        LenpredError: not a CPU list, an empty range, or a CPU this process cannot use.
    """
    if spec is None:
        return None
    cpus: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.strip().partition("-")
        try:
            lo, hi = int(lo), int(hi or lo)
        except ValueError:
            raise LenpredError(f"{name} '{spec}' is not a CPU list such as 0, 0,2 or 0-3") from None
        if hi < lo:
            raise LenpredError(f"{name} '{spec}': the range {lo}-{hi} is empty; write low-high, e.g. {hi}-{lo}")
        cpus.update(range(lo, hi + 1))
    have = os.sched_getaffinity(0)
    if not cpus or not cpus <= have:
        raise LenpredError(f"{name} '{spec}' names CPUs this process cannot use (it has {sorted(have)})")
    return cpus


def check_ports_free(*ports: int, host: str = LOOPBACK) -> None:
    """Refuse to start when a port already answers: a server left from an earlier run would pass the health check
    and take the measurement.

    Raises:
        LenpredError: a port is in use (the message names it).
    """
    import socket

    for port in ports:
        with socket.socket() as s:
            if s.connect_ex((host, port)) == 0:
                raise LenpredError(f"{host}:{port} is in use (a server from an earlier run?): stop it first")


def wait_until_healthy(url: str, proc, log: Path, timeout_s: float, poll_s: float = 1.0) -> None:
    """Poll ``url`` until it answers 200.

    Args:
        url: the health URL.
        proc: the server's ``subprocess.Popen`` (its exit ends the wait).
        log: the server's log file (named in errors).
        timeout_s: seconds to wait.
        poll_s: seconds between polls.

    Raises:
        LenpredError: the process exited before answering, or no answer within ``timeout_s``.
    """
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            name = proc.args[0] if isinstance(proc.args, (list, tuple)) else proc.args
            raise LenpredError(f"{name} exited ({proc.returncode}) before answering: see {log}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(poll_s)
    raise LenpredError(f"{url} did not answer within {timeout_s:.0f} s: see {log}")


def stop_process_group(proc, timeout_s: float = 20.0) -> None:
    """SIGTERM the process group of ``proc`` (started with ``start_new_session=True``); SIGKILL it when it has not
    stopped within ``timeout_s``. A process that already exited is left alone."""
    import signal

    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout_s)
    except ProcessLookupError:
        pass
    except Exception:  # noqa: BLE001 - did not stop in time: kill its group
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


class ServerGroup:
    """Starts servers one after another as process groups and stops all of them on exit (also on errors).

    Each server is started only once the previous one answers its health URL. ``VLLM_CPU_NUM_OF_RESERVED_CPU``
    defaults to ``0`` in their environment (vLLM's CPU build would otherwise keep a core back).

    Args:
        commands: one command line per server.
        urls: the health URL of each (answers 200 once it serves).
        logs: the log file of each (stdout and stderr; parents are created).
        timeout_s: seconds each server may take to answer.
        cpus: CPU ids each server is pinned to (``None``: not pinned), e.g. from :func:`parse_cpu_set`.
        ports: loopback ports that must be free before anything starts (:func:`check_ports_free`).

    Attributes:
        procs: the running ``subprocess.Popen`` objects, in start order (empty after exit).

    Raises:
        LenpredError: on enter, a port in use, a server that exited or did not answer in time (the ones already
            started are stopped first).
    """

    def __init__(self, commands: list[list[str]], urls: list[str], logs: list[Path], timeout_s: float,
                 cpus: list[set[int] | None] | None = None, ports: tuple[int, ...] = ()):
        self.commands, self.urls, self.logs, self.timeout_s = commands, urls, logs, timeout_s
        self.cpus = cpus or [None] * len(commands)
        self.ports = tuple(ports)
        self.procs = []

    def __enter__(self):
        import subprocess

        check_ports_free(*self.ports)
        env = dict(os.environ, VLLM_CPU_NUM_OF_RESERVED_CPU=os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU", "0"))
        try:
            for cmd, url, log, cpus in zip(self.commands, self.urls, self.logs, self.cpus):
                log.parent.mkdir(parents=True, exist_ok=True)
                pin = (lambda c=cpus: os.sched_setaffinity(0, c)) if cpus else None
                self.procs.append(subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env,
                                                   start_new_session=True, preexec_fn=pin))
                wait_until_healthy(url, self.procs[-1], log, self.timeout_s)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        for proc in reversed(self.procs):
            stop_process_group(proc)
        self.procs = []


def exit_on_sigterm() -> None:
    """Make SIGTERM (``timeout``, ``kill``) exit through Python (status 143), so context managers such as
    :class:`ServerGroup` and vLLM's own clean-up run and no engine process is left behind. Sets a process-wide
    signal handler: call it from a script's ``__main__``, never from library code."""
    import signal
    import sys

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
