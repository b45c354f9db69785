"""What a client installs in its rank's process: the exception hooks and the stack-dump signal handler.

* :func:`install_report_hook` chains a ``sys.excepthook`` that reports an
  uncaught exception to the monitor (the fault's fingerprint);
* :func:`install_exception_hook` (``install_exception_hook`` config key) exits
  hard after the traceback, so live non-daemon threads cannot keep a dying rank;
* :class:`StackDump` is the rank's stack-dump file in the job directory and the
  ``faulthandler`` signal (``stack_dump_signal``) that writes every thread's
  stack to it, read by the monitor when the rank hangs.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
from types import TracebackType
from typing import IO, Any, Optional, Protocol

from ft_core.jobdir import JobDir, create_private_file, make_private_dir

__all__ = ["StackDump", "install_exception_hook", "install_report_hook"]

log = logging.getLogger("ft_core.client")


class ExceptionReporter(Protocol):
    """What the report hook reports to (a ``RankMonitorClient``)."""

    def report_exception(self, exc: BaseException) -> None: ...


def install_report_hook(client: ExceptionReporter) -> None:
    """Chain a ``sys.excepthook`` that reports an uncaught exception to ``client``'s monitor (once per process).

    A training loop that lets its exception escape (plain PyTorch) still gives the
    launcher the fault's fingerprint; the previous hook (the traceback) runs as before.
    """
    global _report_hook_client
    _report_hook_client = client
    if getattr(sys.excepthook, "_ft_reports", False):
        return
    previous = sys.excepthook

    def _hook(exc_type: type[BaseException], exc: BaseException, tb: Optional[TracebackType]) -> None:
        if _report_hook_client is not None and not isinstance(exc, (KeyboardInterrupt, SystemExit)):
            _report_hook_client.report_exception(exc)
        previous(exc_type, exc, tb)

    _hook._ft_reports = True  # type: ignore[attr-defined]
    sys.excepthook = _hook


#: The client the report hook reports to: the last one initialised in this process.
_report_hook_client: Optional[ExceptionReporter] = None


def install_exception_hook() -> None:
    """Chain a ``sys.excepthook`` that exits the process (code 1) after the previous hooks ran."""
    previous = sys.excepthook

    def _hook(exc_type, exc, tb) -> None:
        # Report, then exit hard: live non-daemon threads (data loaders, comm
        # watchdogs) would otherwise keep a dying rank hanging at shutdown.
        previous(exc_type, exc, tb)
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)

    sys.excepthook = _hook


class StackDump:
    """The rank's stack-dump file and the ``faulthandler`` signal that writes to it (one per client)."""

    def __init__(self) -> None:
        self._file: Optional[IO[str]] = None
        self._signal: Optional[signal.Signals] = None
        #: The signal was at its default and given a do-nothing handler under the dump handler
        #: (:func:`_ignore_when_unhandled`).
        self._ignored = False

    def open(self, socket_path: str, rank: int) -> Optional[str]:
        """Create the dump file in the job directory of ``socket_path``; its path, or None (dumps disabled)."""
        job_dir = JobDir.of_socket(socket_path)
        path = job_dir.stack_dump_file(rank, os.getpid())
        try:
            make_private_dir(job_dir.stacks)
            # A new 0600 file, never through a planted symlink; a leftover of an earlier process with
            # our pid (a reused standalone directory) is replaced.
            fd = create_private_file(path, replace=True, append=True)
            self._file = open(fd, "a", encoding="utf-8")  # noqa: SIM115 - faulthandler keeps the fd
        except OSError as exc:
            log.warning("stack dumps disabled: cannot create %s: %s", path, exc)
            return None
        return path

    def register(self, sig: Optional[signal.Signals]) -> None:
        """Dump every thread's stack to the file on ``sig``; None (no signal configured) closes the file."""
        if sig is None or self._file is None:
            self.close()
            return
        self._ignored = _ignore_when_unhandled(sig)
        # C-level handler: it dumps even when the main thread is stuck in a collective.
        faulthandler.register(sig, file=self._file, all_threads=True, chain=False)
        self._signal = sig

    def unregister(self) -> None:
        """Remove the signal handler (the signal back at its default if it was there) and close the file."""
        if self._signal is not None and self._file is not None:
            faulthandler.unregister(self._signal)
            if self._ignored and signal.getsignal(self._signal) is _ignore_dump_request:
                signal.signal(self._signal, signal.SIG_DFL)  # the client is done, the process goes on
        self._signal, self._ignored = None, False
        self.close()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _ignore_dump_request(signum: int, frame: Any) -> None:
    """A stack-dump request once faulthandler's handler is gone (a rank exiting): nothing to dump, nothing to end."""


def _ignore_when_unhandled(sig: signal.Signals) -> bool:
    """Give ``sig`` a handler that does nothing where it would terminate the rank, before faulthandler takes it over;
    whether it did.

    faulthandler restores the disposition it found when its handler is removed at interpreter shutdown. A rank
    that is exiting (an exception raised by a collective whose peer died) can still be asked for its stacks by a
    hang diagnosis on another node; with the default disposition the request killed it (``killed by SIGUSR2`` in
    ``benchmarks/goodput.py``, in place of its own exit code). A Python handler rather than ``SIG_IGN``: exec resets
    it, so what the process starts never inherits an ignored signal (a rank whose termination signal it is).
    :meth:`StackDump.unregister` (the client's shutdown) puts the default back. A disposition the program chose (a
    handler of its own, or ignored) is kept.
    """
    try:
        if signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, _ignore_dump_request)
            return True
    except ValueError:  # not the main thread: the default stays, as before
        pass
    return False
