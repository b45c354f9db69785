"""Starting the monitor as a subprocess (``python -m ft_core.monitor``) and the handle on it."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import subprocess
import sys
from collections.abc import Mapping
from typing import Any, Optional

from ft_core.config import FaultToleranceConfig
from ft_core.config_loading import LoadedConfig
from ft_core.event_file import read_events
from ft_core.jobdir import (
    TOKEN_ENV,
    JobDir,
    SocketLink,
    is_shared_dir,
    link_socket,
    make_private_dir,
    token_path,
    write_private_file,
)
from ft_core.utils import procutil

__all__ = ["STANDBY_FLAG", "MonitorProcess", "StandbyMonitor", "run_in_subprocess"]

#: The only argument of a monitor started before its settings are known (see :class:`StandbyMonitor`).
STANDBY_FLAG = "--standby"


def run_in_subprocess(
    cfg: FaultToleranceConfig | LoadedConfig,
    socket_path: Optional[str] = None,
    is_restarter_logger: bool = False,
    mp_ctx: Any = None,
    env: Optional[Mapping[str, str]] = None,
    *,
    ipc_socket_path: Optional[str] = None,
    token: Optional[str] = None,
    events_path: Optional[str] = None,
    start_timeout: float = 30.0,
    stacks_dir: Optional[str] = None,
    wait: bool = True,
    launcher_reports_hangs: bool = False,
    standby: Optional[StandbyMonitor] = None,
) -> MonitorProcess:
    """Start a monitor in a new process (``python -m ft_core.monitor``) and wait until it serves.

    NVRx's signature is accepted, positional or keyword:
    ``run_in_subprocess(cfg, ipc_socket_path, is_restarter_logger=False, mp_ctx=..., env=None)``.
    ``socket_path`` and ``ipc_socket_path`` are the same argument (give one).
    ``env``: variables set in the monitor's environment on top of this
    process's. ``is_restarter_logger`` and ``mp_ctx`` have no effect: the
    monitor is always a fresh interpreter (as NVRx's ``spawn`` context) and
    logs no restarter transitions. The handle has ``mp.Process``'s
    ``terminate()``, ``join()``, ``is_alive()`` and ``exitcode``.

    A socket path in a shared sticky directory such as ``/tmp`` (NVRx's tests
    use ``/tmp/_rmon_r<rank>.socket``) becomes a symlink to the socket of a
    private job directory (:func:`~ft_core.jobdir.link_socket`): ranks
    connect through it, while the token, events and stack dumps stay private.

    With ``wait=False`` it returns at once; call ``wait_ready()`` on the handle before using the socket.

    With ``token=None`` the current ``FT_MONITOR_TOKEN`` is used, or a new
    one is generated and exported to ``os.environ`` so that ranks started
    later from this process inherit it. The token is also written to
    ``<socket_path>.token`` (mode 0600) for ranks started elsewhere by the
    same user. ``cfg`` (a config as loaded, with the keys set at launch, or a config alone: every key
    set), ``stacks_dir``, ``launcher_reports_hangs``: see :class:`~ft_core.monitor.server.RankMonitorServer`. With a ``standby``
    monitor, that process becomes the monitor (it has imported already), unless it is gone.

    Raises:
        TypeError: no socket path, both names given, or ``is_restarter_logger`` not a bool.
    """
    socket_path = _one_socket_path(socket_path, ipc_socket_path)
    if not isinstance(is_restarter_logger, bool):
        raise TypeError(f"is_restarter_logger: expected a bool, got {is_restarter_logger!r}")
    token = token or os.environ.get(TOKEN_ENV) or secrets.token_hex(16)
    os.environ[TOKEN_ENV] = token
    socket_path = os.path.abspath(socket_path)
    link = None
    if is_shared_dir(os.path.dirname(socket_path)):
        link = link_socket(socket_path)
        socket_path = link.socket_path
    try:
        job_dir = JobDir.of_socket(socket_path)
        make_private_dir(job_dir.path)
        write_private_file(token_path(socket_path), token)
        child_env = {**os.environ, **(env or {}), TOKEN_ENV: token}  # via the environment: argv is visible to all
        args = [sys.executable, "-m", "ft_core.monitor", "--socket", socket_path,
                "--config-json", LoadedConfig.of(cfg).to_json()]
        if events_path:
            args += ["--events", events_path]
        if stacks_dir:
            args += ["--stacks-dir", stacks_dir]
        if launcher_reports_hangs:
            args.append("--launcher-reports-hangs")
        proc = standby.take(args[3:], child_env) if standby is not None else None
        if proc is None:
            proc = subprocess.Popen(args, env=child_env, stdout=subprocess.PIPE,
                                    preexec_fn=procutil.die_with_parent)
    except BaseException:
        if link is not None:
            link.release()
        raise
    handle = MonitorProcess(proc, socket_path, token, events_path or job_dir.monitor_events, link)
    if wait:
        handle.wait_ready(start_timeout)
    return handle


def _one_socket_path(socket_path: Optional[str], ipc_socket_path: Optional[str]) -> str:
    """The socket path, given as ours (``socket_path``) or as NVRx's (``ipc_socket_path``)."""
    if socket_path is not None and ipc_socket_path is not None:
        raise TypeError("give the monitor's socket path once: socket_path or ipc_socket_path (NVRx's name)")
    path = socket_path if socket_path is not None else ipc_socket_path
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"socket_path: expected a path (str), got {path!r}")
    return os.fspath(path)


class StandbyMonitor:
    """A monitor process started before its settings are known (``python -m ft_core.monitor --standby``).

    It imports while its starter does other things (``ft_launcher`` starts it
    before its own imports), then waits for its command line and environment
    on stdin: :func:`run_in_subprocess` hands them over (:meth:`take`).
    Dies with its starter, as any monitor; :meth:`close` ends one never taken.
    """

    def __init__(self) -> None:
        self.proc: Optional[subprocess.Popen] = subprocess.Popen(
            [sys.executable, "-m", "ft_core.monitor", STANDBY_FLAG], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            preexec_fn=procutil.die_with_parent)

    def take(self, args: list[str], env: dict[str, str]) -> Optional[subprocess.Popen]:
        """The process, now the monitor of ``args`` (``python -m ft_core.monitor`` ``args``) and ``env``.

        None if it is gone (then start a new one): once, whatever happens.
        """
        proc, self.proc = self.proc, None
        if proc is None or proc.stdin is None:
            return None
        try:
            # One line; a pipe's buffer holds a usual environment, so this does not wait for its imports.
            proc.stdin.write(json.dumps({"argv": args, "env": env}).encode() + b"\n")
            proc.stdin.close()
        except OSError:  # it died (e.g. a broken installation): the new one will say why
            _end(proc)
            return None
        return proc

    def release(self) -> None:
        """Let go of the process without ending it: in a process forked from its starter (a worker factory)."""
        proc, self.proc = self.proc, None
        if proc is not None:
            _close_pipes(proc)

    def close(self) -> None:
        """End the process if it was never taken."""
        proc, self.proc = self.proc, None
        if proc is not None:
            _end(proc)


def _close_pipes(proc: subprocess.Popen) -> None:
    """Close our ends of the process's stdin and stdout pipes."""
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()


def _end(proc: subprocess.Popen) -> None:
    _close_pipes(proc)
    if proc.poll() is None:
        proc.kill()
    proc.wait()


class MonitorProcess:
    """Handle on a monitor started by :func:`run_in_subprocess` (also with ``mp.Process``'s names, as NVRx's)."""

    def __init__(self, proc: subprocess.Popen, socket_path: str, token: str, events_path: str,
                 link: Optional[SocketLink] = None) -> None:
        self.proc = proc
        self.socket_path = socket_path
        self.token = token
        self.events_path = events_path
        self._link = link

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def exitcode(self) -> Optional[int]:
        """None while it runs, then its exit code (``-N`` if signal N ended it), as ``mp.Process.exitcode``."""
        return self._reaped(self.proc.poll())

    def wait_ready(self, timeout: float) -> None:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else b""
        self.proc.stdout.close()
        if line.strip() != b"ready":
            self.kill()
            raise RuntimeError(
                f"rank monitor did not start within {timeout:.0f} s (exit code {self.proc.poll()}); "
                "see its log above"
            )

    def is_alive(self) -> bool:
        return self.exitcode is None

    def terminate(self) -> None:
        """SIGTERM, without waiting (``mp.Process.terminate``): the monitor stops serving and exits."""
        if self.proc.poll() is None:
            self.proc.terminate()

    def join(self, timeout: Optional[float] = None) -> None:
        """Wait until it exits, at most ``timeout`` seconds (``mp.Process.join``: check :attr:`exitcode`)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._reaped(self.proc.wait(timeout))

    def stop(self, timeout: float = 5.0) -> Optional[int]:
        """SIGTERM, then SIGKILL after ``timeout``; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self._reaped(self.proc.wait())

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self._reaped(self.proc.wait())

    def _reaped(self, code: Optional[int]) -> Optional[int]:
        """``code``; once the process has exited, its link in a shared directory and job dir go (if any)."""
        if code is not None and self._link is not None:
            self._link.release()
            self._link = None
        return code

    def events(self) -> list[dict[str, Any]]:
        return read_events(self.events_path)[0]
