"""Pre-warmed workers, launcher side: a factory per cycle, and the workers it forks adopted as our children.

A restarted worker used to spend most of its start-up in ``import torch``.
With pre-warming, a factory process (:mod:`ft_core.launcher.startup.zygote`) has
already imported torch and the ``--ft-prewarm-modules``; each cycle's workers
are forked from it. While nothing else happens, it also forks its successor
(the next cycle's factory, warm at once), which takes over when it exits at
the end of its cycle.

Why the launcher can treat a forked worker exactly like a worker it started:
while a cycle is forked, the launcher is a *child subreaper*
(``PR_SET_CHILD_SUBREAPER``). When the factory exits, the kernel re-parents
its children (the workers and the successor) to the launcher, atomically,
before the factory can be reaped. After :meth:`WorkerFactory.cycle` has
reaped the factory, every forked worker is a real child of the launcher:
``waitpid`` gives its exact status, its pid cannot be reused before the
launcher reaps it (so signals never hit a stranger), ``killpg`` reaches its
session as for a plain start, and the worker sets its parent-death signal
only once the launcher is its parent (set earlier, it would fire when the
factory exits). The subreaper setting is switched off again right after, so
orphans of later cycles go to init as before.

Torch's ``SubprocessHandler`` expects a ``Popen``; :class:`AdoptedProcess`
provides what torch elastic and the agent use of it (``pid``, ``args``,
``returncode``, ``poll``, ``wait``, ``send_signal``, ``terminate``, ``kill``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Optional, Union

from ft_core.launcher.startup.factory_protocol import (
    EntryKind,
    FactoryChannel,
    FactoryError,
    Failed,
    Fork,
    Forked,
    Prepare,
    Prepared,
    PythonInvocation,
    Ready,
    Retire,
    Retired,
)
from ft_core.launcher.startup.zygote import ALWAYS_PREWARMED, bootstrap_command, run_worker, serve
from ft_core.utils import procutil
from ft_core.utils.deadline import wait_until

__all__ = ["AdoptedProcess", "WorkerFactory"]

log = logging.getLogger("ft_core.launcher")

#: The first factory imports torch and the user's modules, a successor ``RESTART_PREWARMED`` (and so may a first
#: factory left idle, when its first fork is asked): a loaded node can take long.
READY_TIMEOUT = 300.0
#: Round trips with a warm factory (a fork, the successor's start) take milliseconds.
REQUEST_TIMEOUT = 30.0


class AdoptedProcess:
    """A forked worker (or factory) that the launcher adopted: the ``Popen`` subset torch elastic uses.

    The process is a real child of the launcher once its factory exited (see the
    module docstring), so this is ``Popen``'s own logic on a pid. One thread at
    a time, like the agent that owns it.
    """

    def __init__(self, pid: int, args: Sequence[str]) -> None:
        self.pid = pid
        self.args = list(args)
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                # Impossible by construction (adopted before anyone polls, reaped only here); if it
                # ever happens, report a failure: a lost worker must never look like a finished one.
                log.error("worker pid %d is not a child of the launcher any more; counting it as failed", self.pid)
                self.returncode = 1
                return self.returncode
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        """As ``Popen.wait``: the exit code (``-N`` for signal N); ``TimeoutExpired`` after ``timeout``."""
        if self.returncode is None:
            if timeout is None:
                self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
            elif not procutil.wait_child_exited(self.pid, timeout):
                raise subprocess.TimeoutExpired(self.args, timeout)
        code = self.poll()
        assert code is not None
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # unreaped: the pid is still ours
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __repr__(self) -> str:
        return f"<AdoptedProcess pid {self.pid} returncode {self.returncode} args {self.args!r}>"


class FactoryUnavailable(Exception):
    """The factory cannot fork this cycle's workers; the message says why."""


class WorkerFactory:
    """The launcher's pre-warmed worker factories: one per cycle, each forked from the previous one.

    Use :meth:`for_job` to get one (``None`` when pre-warming cannot apply),
    :meth:`start` early (it warms up in the background), :meth:`cycle` around
    the start of each cycle's workers with :meth:`fork` for each worker, and
    :meth:`close` at the end. Any failure turns pre-warming off for the rest of
    the job with one warning; workers are then started as new processes.
    """

    def __init__(self, interpreter: str, invocation: PythonInvocation, modules: Sequence[str],
                 env: Optional[Mapping[str, str]] = None) -> None:
        self.interpreter = interpreter
        self.invocation = invocation
        self.modules = tuple(modules)
        #: The factory's environment (default: ours now): what its imports see, e.g. ``OMP_NUM_THREADS``.
        self.env = dict(os.environ if env is None else env)
        #: ``sys.path[0]`` of the workers, and of the factory while it imports.
        self.path0 = invocation.path0(os.getcwd())
        self._proc: Optional[Union[subprocess.Popen, AdoptedProcess]] = None
        self._channel: Optional[FactoryChannel] = None
        #: The prepared successor (the factory's child until the factory exits) and our end of its channel.
        self._successor_pid: Optional[int] = None
        self._successor_channel: Optional[FactoryChannel] = None
        self._started = False
        self._ready = False
        #: How the first factory came to be, for the log.
        self.origin = "started as a new process"
        self._in_cycle = False
        self._forked: list[int] = []
        #: The first factory serves the requests (until its first cycle retires it): it may be importing
        #: ``RESTART_PREWARMED`` when its first fork is asked (:data:`~.zygote.IDLE_PREWARM_AFTER`).
        self._first = True
        #: Why pre-warming is off for the rest of the job (None while it works).
        self.unavailable: Optional[str] = None

    @classmethod
    def for_job(cls, entrypoint: Union[str, Callable[..., Any]], args: Sequence[Any], modules: Sequence[str],
                numa_options: Any = None, *, env: Optional[Mapping[str, str]] = None,
                quiet: bool = False) -> Optional[WorkerFactory]:
        """A factory for this job's workers (not started), or ``None`` when they cannot be forked.

        ``None`` comes with one warning naming why, unless ``quiet``. ``env``: see :attr:`env`.
        """
        why_not = None
        invocation = None
        python = os.getenv("PYTHON_EXEC", sys.executable)  # what torchrun runs the training script with
        if not isinstance(entrypoint, str):
            why_not = "the entrypoint is a Python function (--run-path)"
        elif entrypoint != python:
            why_not = f"the entrypoint {entrypoint!r} is not the Python interpreter (--no-python?)"
        elif numa_options is not None:
            why_not = "--numa-binding wraps the worker's command line"
        else:
            invocation = PythonInvocation.parse(entrypoint, [entrypoint, *map(str, args)])
            if invocation is None:
                why_not = f"the command line {' '.join(map(str, args))!r} is not `python [-u] script|-m module`"
            elif invocation.kind is EntryKind.SCRIPT:
                why_not = _not_python_source(invocation.target)
        if why_not is not None or invocation is None or not isinstance(entrypoint, str):
            if not quiet:
                log.warning("pre-warmed workers off: %s; workers are started as new processes", why_not)
            return None
        return cls(entrypoint, invocation, modules, env)

    @property
    def pid(self) -> Optional[int]:
        """The current factory's pid (None before :meth:`start` and after :meth:`close`)."""
        return self._proc.pid if self._proc is not None else None

    @property
    def started(self) -> bool:
        """:meth:`start` was called (the factory may since have failed or been closed)."""
        return self._started

    def differences(self, other: WorkerFactory) -> list[str]:
        """What would make ``other``'s factory process differ from this one's (empty: interchangeable).

        Environment variables are named, never their values (they may hold secrets).
        """
        mine, theirs = self._identity(), other._identity()
        found = [name for name in mine if mine[name] != theirs[name]]
        found += [f"${name}" for name in sorted(self.env.keys() | other.env.keys())
                  if self.env.get(name) != other.env.get(name)]
        return found

    def _identity(self) -> dict[str, object]:
        """Everything but the environment that the factory's command line (:func:`bootstrap_command`) holds."""
        return {"interpreter": self.interpreter, "entry": (self.invocation.kind, self.invocation.target),
                "unbuffered": self.invocation.unbuffered, "path0": self.path0, "modules": self.modules}

    # -- lifecycle ------------------------------------------------------------
    def start(self) -> None:
        """Start the first factory; it imports the modules while the launcher does its rendezvous."""
        self._started = True
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        command = bootstrap_command(self.interpreter, self.invocation, child_end.fileno(), self.path0, self.modules)
        try:
            # A new session: a Ctrl-C meant for the launcher must not reach the factory.
            self._proc = subprocess.Popen(command, pass_fds=(child_end.fileno(),), stdin=subprocess.DEVNULL,
                                          env=self.env, start_new_session=True,
                                          preexec_fn=procutil.die_with_parent_preexec(os.getpid()))
        except OSError as exc:
            parent_end.close()
            self._give_up(f"cannot start the factory: {exc}")
            return
        finally:
            child_end.close()
        self._channel = FactoryChannel(parent_end)
        log.debug("worker factory started (pid %d): importing %s", self._proc.pid, ", ".join(self.modules))
        self._prepare()

    def start_forked(self, release: Callable[[], None]) -> Optional[Callable[[], None]]:
        """Start the first factory as a fork of this process, whose imports (torch's) it then skips.

        For ``ft_launcher`` as its process's entry point, right after its own
        imports, before it starts any thread: torch is imported once on the
        node instead of twice side by side. The child becomes what
        :meth:`start` would have started: its own session, dying with us,
        stdin on ``/dev/null``, no other descriptor of ours (``release``,
        called in the child, closes the ones Python objects hold), this
        factory's environment, and the worker's command line and name in
        ``ps`` (:func:`ft_core.utils.procutil.set_process_title`).

        Returns None in this process. In a worker forked by that factory it
        returns the function that runs the worker's script (and returns when
        the script does, as :func:`ft_core.launcher.startup.zygote.run_worker`): the
        caller must return it up to the process's entry point, whose normal
        exit is then the worker's. Anything else in the child ends it (the
        launcher then hears that the factory exited).
        """
        self._started = True
        self.origin = "forked from the launcher after its imports"
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        launcher_pid = os.getpid()
        title = [self.interpreter, *self.invocation.command_line()]  # the factory's and its workers' in `ps`
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # nothing buffered may be written twice
        try:
            pid = os.fork()
        except OSError as exc:
            parent_end.close()
            child_end.close()
            self._give_up(f"cannot fork the factory: {exc}")
            return None
        if pid == 0:
            try:
                parent_end.close()
                release()
                self._become_forked_factory(launcher_pid, child_end.fileno(), title)
                job, factory_pid = serve(FactoryChannel(child_end), launcher_pid, self.path0,
                                         [*self.modules, *ALWAYS_PREWARMED])
            except BaseException as exc:  # noqa: BLE001 - never return into the launcher as a launcher
                os.write(2, f"ft_launcher: the worker factory failed to start: {exc!r}\n".encode())
                os._exit(1)
            return lambda: run_worker(job, launcher_pid, factory_pid)
        child_end.close()
        self._proc = AdoptedProcess(pid, title)
        self._channel = FactoryChannel(parent_end)
        log.debug("worker factory forked from the launcher (pid %d)", pid)
        self._prepare()
        return None

    def _become_forked_factory(self, launcher_pid: int, channel_fd: int, title: list[str]) -> None:
        """In the child of :meth:`start_forked`: the process :meth:`start` would have started, but warm."""
        os.setsid()  # as start(): a Ctrl-C meant for the launcher must not reach the factory
        procutil.die_with_parent_preexec(launcher_pid)()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        # As Popen's close_fds: only stdio and the channel stay (release() closed what Python objects held).
        os.closerange(3, channel_fd)
        os.closerange(channel_fd + 1, os.sysconf("SC_OPEN_MAX"))
        os.environ.clear()
        os.environ.update(self.env)
        procutil.set_process_title(title)

    @contextlib.contextmanager
    def cycle(self) -> Iterator[None]:
        """Around the start of one cycle's workers: :meth:`fork` works inside; on exit they are our children."""
        previous_subreaper = False
        try:
            self._await_ready()
            previous_subreaper = procutil.set_child_subreaper(True)
        except (FactoryUnavailable, OSError) as exc:
            self._give_up(str(exc))
        if self.unavailable is not None:
            yield
            return
        self._in_cycle = True
        started = time.perf_counter()
        try:
            yield
        finally:
            self._in_cycle = False
            forked = time.perf_counter()
            try:
                if self._forked:
                    self._retire()
                    log.debug("forked %d worker(s) in %.1f ms; the factory retired in %.1f ms", len(self._forked),
                              1e3 * (forked - started), 1e3 * (time.perf_counter() - forked))
            finally:
                self._forked.clear()
                procutil.set_child_subreaper(previous_subreaper)

    def fork(self, argv: Sequence[str], env: dict[str, str], stdio: tuple[int, int, int]) -> Optional[AdoptedProcess]:
        """Fork the worker ``argv`` with ``env`` and ``stdio`` (fds 0-2); ``None``: start it as a new process."""
        if not self._in_cycle or self.unavailable is not None:
            return None
        invocation = PythonInvocation.parse(self.interpreter, argv)
        if invocation is None:
            self._give_up(f"the worker command line {' '.join(argv)!r} is not `python [-u] script|-m module`")
            return None
        assert self._channel is not None
        try:
            self._channel.send(Fork(invocation, env, os.getcwd(), list(argv)), stdio)
            reply = self._receive(READY_TIMEOUT if self._first else REQUEST_TIMEOUT)
        except (OSError, FactoryError, FactoryUnavailable) as exc:
            self._give_up(f"fork failed: {exc}")
            return None
        if not isinstance(reply, Forked) or reply.pid <= 0:
            self._give_up(f"unexpected reply to a fork request: {reply!r}")
            return None
        self._forked.append(reply.pid)
        return AdoptedProcess(reply.pid, argv)

    def close(self) -> None:
        """Stop the factory and its prepared successor (they hold no state: SIGKILL) and reap them."""
        for channel in (self._channel, self._successor_channel):
            if channel is not None:
                channel.close()
        self._channel = self._successor_channel = None
        successor = self._successor_pid or 0
        self._successor_pid = None
        if self._proc is None or self._proc.poll() is not None:
            successor = 0  # the factory is gone: its successor sees its channel closed and exits by itself
        if successor:  # the factory's child: its pid is reserved while the factory lives, safe to signal
            with contextlib.suppress(ProcessLookupError):
                os.kill(successor, signal.SIGKILL)
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
            self._proc = None
        if successor:
            # If we are a subreaper just now, the killed successor became our child: reap it. Else init
            # reaps it; either way it is gone before we return (nothing of the job outlives the launcher).
            wait_until(lambda: _reaped(successor) and not procutil.pid_alive(successor), timeout=REQUEST_TIMEOUT,
                       interval=0.001)

    # -- internals -------------------------------------------------------------
    def _await_ready(self) -> None:
        if self.unavailable is not None or self._ready:
            return
        if self._channel is None:
            raise FactoryUnavailable("the factory was not started")
        # A successor may still import RESTART_PREWARMED when a fault follows a start at once.
        started = time.monotonic()
        try:
            reply = self._receive(READY_TIMEOUT)
        except (OSError, FactoryError) as exc:
            raise FactoryUnavailable(f"no word from the factory: {exc}") from None
        if not isinstance(reply, Ready):
            raise FactoryUnavailable(f"unexpected message from the factory: {reply!r}")
        try:
            prepared = self._receive(REQUEST_TIMEOUT)  # the answer to the Prepare sent in advance
        except (OSError, FactoryError) as exc:
            raise FactoryUnavailable(f"no successor from the factory: {exc}") from None
        if not isinstance(prepared, Prepared) or prepared.successor_pid <= 0:
            raise FactoryUnavailable(f"unexpected message from the factory: {prepared!r}")
        self._successor_pid = prepared.successor_pid
        self._ready = True
        log.debug("worker factory pid %d ready (imports took %.2f s; waited %.2f s)", reply.pid,
                  reply.import_seconds, time.monotonic() - started)

    def _receive(self, timeout: float) -> object:
        assert self._channel is not None
        received = self._channel.recv(timeout)
        if received is None:
            code = self._proc.poll() if self._proc is not None else None
            raise FactoryUnavailable(f"the factory exited (exit code {code})")
        msg, fds = received
        for fd in fds:  # the factory never sends descriptors
            os.close(fd)
        if isinstance(msg, Failed):
            raise FactoryUnavailable(msg.error)
        return msg

    def _prepare(self) -> None:
        """Ask the factory for its successor now, while nothing waits for it (answered before it is Ready).

        The request is queued on the channel: the first factory reads it after
        its imports, a successor right after it took over.
        """
        assert self._channel is not None
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._channel.send(Prepare(), [child_end.fileno()])
        except OSError as exc:
            parent_end.close()
            self._give_up(f"cannot reach the factory: {exc}")
            return
        finally:
            child_end.close()
        self._successor_channel = FactoryChannel(parent_end)

    def _retire(self) -> None:
        """The factory exits; reaping it makes its children ours. Its successor takes over."""
        assert self._channel is not None and self._proc is not None
        try:
            self._channel.send(Retire())
            reply = self._receive(REQUEST_TIMEOUT)
            if not isinstance(reply, Retired):
                raise FactoryUnavailable(f"unexpected reply to a retire request: {reply!r}")
            # Woken at the exit itself: the workers run from that moment, and cycle_start follows.
            if not procutil.wait_child_exited(self._proc.pid, REQUEST_TIMEOUT):
                raise FactoryUnavailable(f"the factory did not exit within {REQUEST_TIMEOUT:.0f} s")
            self._proc.wait()
        except (OSError, FactoryError, FactoryUnavailable) as exc:
            self._give_up(f"retiring the factory failed: {exc}")
            return
        assert self._successor_pid is not None and self._successor_channel is not None
        self._channel.close()
        self._channel, self._successor_channel = self._successor_channel, None
        self._proc = AdoptedProcess(self._successor_pid, ["worker factory"])
        self._successor_pid = None
        self._ready = self._first = False
        self._prepare()

    def _give_up(self, reason: str) -> None:
        """Pre-warming off for the rest of the job, with one warning. Kills and reaps the factory.

        While a cycle is forked the launcher is a subreaper, so workers already
        forked are adopted when the factory dies and run as usual.
        """
        if self.unavailable is None:
            log.warning("pre-warmed workers unavailable (%s); workers are started as new processes", reason)
            self.unavailable = reason
        self.close()


def _reaped(pid: int) -> bool:
    """Reap ``pid`` if it is our dead child; True unless it is our child and still running."""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:
        return True


def _not_python_source(script: str) -> Optional[str]:
    """Why ``script`` is not a Python source file a factory can run, or ``None`` if it is one."""
    try:
        with open(script, "rb") as handle:
            head = handle.read(256)
    except OSError as exc:
        return f"cannot read the script {script!r} ({exc.strerror})"
    first_line = head.split(b"\n", 1)[0]
    if first_line.startswith(b"#!") and b"python" not in first_line:
        return f"{script!r} is not a Python file ({first_line.decode(errors='replace')})"
    if head.startswith((importlib.util.MAGIC_NUMBER, b"PK\x03\x04")):
        return f"{script!r} is compiled or zipped Python, not a source file"
    return None
