"""The worker factory ("zygote"): imports torch once, then forks pre-warmed workers.

A factory is a Python process started by the launcher
(:class:`ft_core.launcher.startup.prewarm.WorkerFactory`) with the worker's interpreter.
It imports the pre-warm modules (torch by default, and ``ft_core.client``),
checks that it is still safe to fork (one thread, CUDA not initialised),
freezes its objects for the garbage collector (so forked workers keep sharing
their pages), says ``Ready`` and waits for requests on its channel to the
launcher:

* ``Prepare``: fork the successor, the next cycle's factory (a copy of this
  warm process, on the new channel sent with the request). The launcher asks
  for it while nothing else happens, so no cycle waits for this fork; the
  successor sleeps until this factory exits.
* ``Fork``: fork a worker. The child starts a new session, takes the stdin,
  stdout and stderr file descriptors the launcher sent with the request, and
  returns out of the factory's loop to run the user's script or ``-m`` module
  as a new interpreter would (:func:`run_worker`).
* ``Retire``: exit (the prepared successor takes over).

A first factory asked for nothing :data:`IDLE_PREWARM_AFTER` seconds after
``Ready`` (a hot spare waiting for a place, a job still gathering its nodes)
imports :data:`RESTART_PREWARMED` meanwhile, as a successor does.

Workers and the successor are re-parented to the launcher when the factory
exits (the launcher is a child subreaper while a cycle is forked), so the
launcher waits for them, gets their exit status and signals them exactly as
it does for the workers it starts itself. Only then do they ask for the
parent-death signal: set earlier, it would fire when the factory exits.

The channel and its messages are :mod:`.factory_protocol`.

This module is imported by the factory before anything else: keep its imports
to the standard library and msgspec (which ``ft_core.client`` needs anyway).
"""

from __future__ import annotations

import gc
import importlib
import io
import os
import select
import signal
import socket
import sys
import threading
import time
import types
from collections.abc import Sequence
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
from ft_core.utils import procutil

__all__ = [
    "IDLE_PREWARM_AFTER",
    "RESTART_PREWARMED",
    "main",
    "run_worker",
    "serve",
]

#: Modules every factory imports besides the user's list: what a rank under ft_launcher imports anyway.
ALWAYS_PREWARMED = ("ft_core.client",)
#: Modules a successor imports once its predecessor has retired (the cycle's workers run; nothing waits for it),
#: when torch is imported: what every restarted rank would import again at its first step. torch.optim's
#: methods import ``torch._dynamo`` at an optimizer's first call (1.6 s idle on a 2-core node, 5-19 s on a loaded
#: one, measured by ``benchmarks/goodput.py``). Not imported by the first factory: the first start would wait for
#: it. Later successors inherit it.
RESTART_PREWARMED = ("torch._dynamo",)
#: A first factory that no request reached this many seconds after ``Ready`` imports :data:`RESTART_PREWARMED` then:
#: nothing waits for it. A hot spare's first workers start on a restart's critical path (a lost node's place), and
#: importing torch._dynamo at their first step cost 1 s of ``benchmarks/goodput.py``'s every node loss. Longer than a
#: one-node start leaves its factory idle, so those first workers are forked at once, as before; a fork asked during
#: the import waits for the rest of it, which its workers would have spent at their optimizer's first step.
IDLE_PREWARM_AFTER = 5.0
#: While a forked process waits to be re-parented to the launcher, it checks this often.
_ADOPTION_POLL = 0.0002


# -- the factory process ---------------------------------------------------------------------------


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Entry point of a factory (see :func:`bootstrap_command`); returns only in a forked worker."""
    options: dict[str, str] = {}
    for arg in sys.argv[1:] if argv is None else argv:
        key, _, value = arg.removeprefix("--").partition("=")
        options[key] = value
    channel = FactoryChannel(socket.socket(fileno=int(options["channel-fd"])))
    launcher_pid = int(options["launcher-pid"])
    job, factory_pid = serve(channel, launcher_pid, options["path0"], options["modules"].split(","))
    run_worker(job, launcher_pid, factory_pid)


def serve(channel: FactoryChannel, launcher_pid: int, path0: str, modules: Sequence[str]) -> tuple[Fork, int]:
    """Be the factory: import ``modules``, say ``Ready``, answer the launcher; returns only in a forked worker.

    Returns the worker's request and the pid of the factory that forked it,
    for :func:`run_worker`. Used by a factory started as a new process
    (:func:`main`) and by one forked from the launcher after its own imports
    (``WorkerFactory.start_forked``), where torch is imported already.
    """
    sys.path[0] = path0  # what the worker's sys.path[0] will be: imports resolve as in the worker
    started = time.perf_counter()
    try:
        _import_for_fork(modules)
    except BaseException as exc:  # noqa: BLE001 - whatever happened, the launcher must hear why
        channel.send(Failed(f"{type(exc).__name__}: {exc}"))
        os._exit(1)
    channel.send(Ready(os.getpid(), time.perf_counter() - started))
    return _answer_requests(channel, launcher_pid, idle_prewarm_at=time.monotonic() + IDLE_PREWARM_AFTER)


def _import_for_fork(names: Sequence[str], *, skip_failed: bool = False) -> None:
    """Import ``names``, check that this process may still fork, and freeze its objects for the workers.

    As the gc.freeze() docs advise for a process that forks: no collection from the first import to
    the freeze. Its passes over torch's objects would take a tenth of a second and free holes in pages
    that the workers' allocations would then fill, copying those pages. The objects that exist then
    are shared with every worker: frozen, the workers' collector does not write into them (which would
    copy their pages). Raises what an import raised (``skip_failed``: a module that fails is left out)
    or :class:`FactoryError` when forking is no longer safe.
    """
    gc.disable()
    try:
        for name in filter(None, names):
            try:
                importlib.import_module(name)
            except Exception:
                if not skip_failed:
                    raise
        _check_forkable()
    finally:
        gc.freeze()
        gc.enable()  # as in a new interpreter: the workers are forked from here


def bootstrap_command(interpreter: str, invocation: PythonInvocation, channel_fd: int, path0: str,
                      modules: Sequence[str]) -> list[str]:
    """The factory's command line. ``-c`` keeps this module out of ``__main__``; ``-u`` as the workers."""
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = (f"import sys; sys.path.insert(0, {package_root!r}); from ft_core.launcher.startup.zygote import main; "
            "del sys.path[0]; main()")
    # --entry names the script in `ps` (forked workers show this command line too), so that
    # `pgrep -f train.py` finds the factory and its workers.
    return [interpreter, *(["-u"] if invocation.unbuffered else []), "-c", code, f"--channel-fd={channel_fd}",
            f"--launcher-pid={os.getpid()}", f"--path0={path0}",
            f"--modules={','.join([*modules, *ALWAYS_PREWARMED])}", f"--entry={invocation.target}"]


def _check_forkable() -> None:
    """Refuse to fork when a pre-warmed module left state that fork cannot carry over."""
    if threading.active_count() > 1:
        names = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
        raise FactoryError(f"a pre-warmed module started Python threads {names}; fork would lose them")
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise FactoryError("a pre-warmed module initialised CUDA; a forked worker could not use it")
    # torch.cuda.is_available() (and device_count()) at import initialise the driver without setting
    # is_initialized(), and "poison fork" all the same: the driver's library in the process says so.
    driver = _cuda_driver_loaded()
    if driver is not None:
        raise FactoryError(f"a pre-warmed module initialised the CUDA driver ({driver} is loaded, e.g. by "
                           "torch.cuda.is_available() at import); a forked worker could not use CUDA")
    # Libraries that run threads stop them in their fork handlers (OpenBLAS does); a probe fork
    # runs those handlers, and any native thread still running afterwards would be lost by fork.
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    threads = len(os.listdir("/proc/self/task"))
    if threads > 1:
        raise FactoryError(f"{threads - 1} native thread(s) still run after import; fork would lose them")


def _restart_prewarmed() -> Union[Ready, Failed]:
    """A successor's imports of :data:`RESTART_PREWARMED` (with torch imported), then ``Ready`` or why it cannot fork.

    A module that fails to import is left to the workers (they would fail at the same import).
    """
    started = time.perf_counter()
    wanted = [name for name in RESTART_PREWARMED if "torch" in sys.modules and name not in sys.modules]
    if not wanted:
        return Ready(os.getpid(), 0.0)
    try:
        _import_for_fork(wanted, skip_failed=True)  # e.g. a Python the torch's compiler does not support yet
    except FactoryError as exc:
        return Failed(str(exc))
    return Ready(os.getpid(), time.perf_counter() - started)


def _cuda_driver_loaded() -> Optional[str]:
    """The CUDA driver library (``libcuda.so*``) mapped into this process, or None (Linux ``/proc``)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.split()[-1] if line.count(" ") >= 5 else ""
                if os.path.basename(path).startswith("libcuda.so"):
                    return path
    except OSError:
        pass
    return None


def _answer_requests(channel: FactoryChannel, launcher_pid: int, idle_prewarm_at: Optional[float] = None
                     ) -> tuple[Fork, int]:
    """Answer the launcher's requests. Returns (request, factory pid) only in a forked worker.

    The factory itself exits in here: when retired, or when the launcher closes the channel. With no request
    by ``idle_prewarm_at`` (monotonic), it imports :data:`RESTART_PREWARMED` then (:data:`IDLE_PREWARM_AFTER`).
    """
    #: The write end of the pipe the prepared successor sleeps on; it sees EOF when we exit.
    successor_wakeup: Optional[int] = None
    while True:
        if idle_prewarm_at is not None and not _readable(channel, idle_prewarm_at - time.monotonic()):
            idle_prewarm_at = None
            warmed = _restart_prewarmed()
            if isinstance(warmed, Failed):  # no fork from here: the launcher's next request hears why
                channel.send(warmed)
                os._exit(1)
            continue
        try:
            received = channel.recv()
        except (OSError, FactoryError):
            os._exit(1)
        if received is None:  # the launcher closed the channel (or died)
            os._exit(0)
        msg, fds = received
        factory_pid = os.getpid()
        if isinstance(msg, Fork) and len(fds) == 3:
            pid = _fork_worker(channel, fds, [successor_wakeup] if successor_wakeup is not None else [])
            if pid == 0:
                return msg, factory_pid
            channel.send(Forked(pid))
        elif isinstance(msg, Prepare) and len(fds) == 1 and successor_wakeup is None:
            wakeup_r, successor_wakeup = os.pipe()
            pid = os.fork()
            if pid == 0:  # the successor: the next cycle's factory, already warm
                os.close(successor_wakeup)
                channel.close()
                channel = FactoryChannel(socket.socket(fileno=fds[0]))
                successor_wakeup = idle_prewarm_at = None  # it imports RESTART_PREWARMED when it takes over
                os.read(wakeup_r, 1)  # EOF when the factory exits (or dies)
                os.close(wakeup_r)
                _wait_adopted(launcher_pid, factory_pid)
                try:
                    channel.send(_restart_prewarmed())
                except OSError:  # the launcher gave up on pre-warming meanwhile
                    os._exit(0)
                continue
            os.close(wakeup_r)
            os.close(fds[0])
            channel.send(Prepared(pid))
        elif isinstance(msg, Retire) and not fds:
            channel.send(Retired())
            os._exit(0)
        else:
            for fd in fds:
                os.close(fd)
            channel.send(Failed(f"unexpected request {type(msg).__name__} with {len(fds)} descriptor(s)"))


def _readable(channel: FactoryChannel, timeout: float) -> bool:
    """Whether a request (or the channel's end) arrives within ``timeout`` seconds; the frame is read whole after."""
    return bool(select.select([channel.sock], [], [], max(0.0, timeout))[0])


def _fork_worker(channel: FactoryChannel, stdio: list[int], inherited: list[int]) -> int:
    """Fork; the child closes ``inherited``, starts its own session and takes ``stdio`` as fds 0-2.

    Returns the child's pid (0 in the child). Nothing waits for the child: until
    it leads its session, the launcher signals its pid instead of its group
    (see ``ft_core.launcher.startup.workers``).
    """
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # nothing buffered may be written twice
    pid = os.fork()
    if pid == 0:
        try:
            for fd in inherited:
                os.close(fd)
            channel.close()
            os.setsid()  # as Popen(start_new_session=True): killpg(pid) reaches the worker's group
            for target, fd in enumerate(stdio):
                os.dup2(fd, target)
            for fd in stdio:
                os.close(fd)
        except BaseException as exc:  # noqa: BLE001 - never return into the factory's loop
            os.write(2, f"ft_launcher: pre-warmed worker setup failed: {exc!r}\n".encode())
            os._exit(1)
        return 0
    for fd in stdio:
        os.close(fd)
    return pid


def _wait_adopted(launcher_pid: int, factory_pid: int) -> None:
    """Wait until the factory has exited and the launcher is our parent; then die with the launcher."""
    while (parent := os.getppid()) != launcher_pid:
        if parent != factory_pid:  # re-parented elsewhere: the launcher died first
            os._exit(1)
        time.sleep(_ADOPTION_POLL)
    procutil.die_with_parent(signal.SIGKILL)
    if os.getppid() != launcher_pid:  # the launcher died before the request took effect
        os._exit(1)


# -- the worker, after the fork ---------------------------------------------------------------------


def run_worker(job: Fork, launcher_pid: int, factory_pid: int) -> None:
    """Become the worker ``job`` describes and run its script or module as ``python`` would.

    An uncaught exception is printed by ``sys.excepthook`` without the
    factory's frames and ends the worker with exit code 1; ``SystemExit``
    propagates as in a new interpreter, whose normal shutdown (atexit,
    non-daemon threads, flushing) follows.
    """
    os.chdir(job.cwd)
    os.environ.clear()
    os.environ.update(job.env)  # putenv too: C libraries read the same values
    invocation = job.invocation
    _reset_stdio(invocation.unbuffered or bool(job.env.get("PYTHONUNBUFFERED")))
    _reset_caught_signals(job.env.get(procutil.SIGNALS_TO_HANDLE_ENV, ""))
    _reseed()
    sys.orig_argv = list(job.orig_argv)
    sys.path[0] = invocation.path0(job.cwd)
    main_module = types.ModuleType("__main__")
    sys.modules["__main__"] = main_module
    _wait_adopted(launcher_pid, factory_pid)  # no user code runs before it dies with the launcher
    try:
        if invocation.kind is EntryKind.MODULE:
            import runpy

            sys.argv = ["-m", *invocation.args]
            # What `python -m` itself calls: same module search, argv[0], messages and exit codes.
            runpy._run_module_as_main(invocation.target, alter_argv=True)  # type: ignore[attr-defined]
        else:
            sys.argv = [invocation.target, *invocation.args]
            _run_script(invocation.target, main_module)
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - report as the interpreter would, then exit
        _report_uncaught(exc)


def _reset_caught_signals(names: str) -> None:
    """The signals the launcher catches (``names``: ``SIGTERM,SIGINT,...``) as a worker it execs finds them.

    exec resets a caught signal to its default, and CPython then installs its own SIGINT handler; the factory
    was forked before the launcher caught them, so it holds the dispositions the launcher started with: SIGINT
    and SIGQUIT ignored when the launcher runs in the background of a non-interactive shell (``ft_launcher ...
    &`` in a batch script), where a plain start has them at their default.
    """
    for sig in procutil.signals_named(names):
        signal.signal(sig, signal.SIG_DFL)
    if signal.getsignal(signal.SIGINT) == signal.SIG_DFL:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _reset_stdio(unbuffered: bool) -> None:
    """New ``sys.stdin/stdout/stderr`` on fds 0-2, built as CPython builds them at start-up.

    Line buffering depends on whether the new descriptors are terminals, and
    ``-u`` / ``PYTHONUNBUFFERED`` on the worker's command line and environment.
    """
    def stream(fd: int, old: Any, name: str, write: bool) -> io.TextIOWrapper:
        binary: Any = open(fd, "wb" if write else "rb", buffering=0 if unbuffered and write else -1, closefd=False)
        raw = binary if unbuffered and write else binary.raw
        raw.name = name
        line_buffering = not unbuffered and (raw.isatty() or fd == 2)
        text: Any = io.TextIOWrapper(binary, encoding=old.encoding, errors=old.errors, newline="\n",
                                     line_buffering=line_buffering, write_through=unbuffered)
        text.mode = "w" if write else "r"
        return text

    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        new = stream(fd, getattr(sys, f"__{name}__"), f"<{name}>", write=fd > 0)
        setattr(sys, name, new)
        setattr(sys, f"__{name}__", new)


def _reseed() -> None:
    """Random state a new interpreter would draw from the OS at start-up, drawn again.

    ``random`` reseeds itself after a fork. torch's default CPU generator and
    numpy's legacy global one are seeded from the OS when they are imported,
    in the factory here: without a new seed every worker (of every cycle)
    would draw the same numbers. A seed a pre-warmed module set at import is
    replaced too: seed in the script.
    """
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.default_generator.seed()  # CPU only: CUDA generators start with CUDA, in the worker
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()


def _run_script(target: str, main_module: types.ModuleType) -> None:
    """``python script.py``: compile the file and run it in ``__main__`` with CPython's globals."""
    path = target if os.path.isabs(target) else os.path.join(os.getcwd(), target)  # absolute, not normalised
    try:
        with io.open_code(path) as handle:
            source = handle.read()
    except OSError as exc:
        sys.stderr.write(f"{sys.executable}: can't open file {path!r}: [Errno {exc.errno}] {exc.strerror}\n")
        raise SystemExit(2) from None
    from importlib.machinery import SourceFileLoader

    namespace = main_module.__dict__
    namespace.update(__file__=path, __cached__=None, __loader__=SourceFileLoader("__main__", path),
                     __builtins__=sys.modules["builtins"])
    exec(compile(source, path, "exec", dont_inherit=True), namespace)


def _report_uncaught(exc: BaseException) -> None:
    """What CPython does with an exception that leaves ``__main__``; never returns."""
    tb = exc.__traceback__
    # Drop the factory's own frames: the traceback starts where a plain start's would.
    while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, "<string>"):
        tb = tb.tb_next
    # The default hook prints the exception's own traceback when it has one: replace it too.
    sys.excepthook(type(exc), exc.with_traceback(tb), tb)
    if isinstance(exc, KeyboardInterrupt):
        # CPython ends with SIGINT after an uncaught KeyboardInterrupt, so the parent sees the signal.
        import atexit

        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    raise SystemExit(1)
