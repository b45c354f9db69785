"""ft_launcher from Python: :func:`run`, torchrun's in-process contract, and the caller's process state kept.

Frameworks launch torchrun from Python (``torch.distributed.run.run(args)``), which
returns when every worker succeeded, raises ``ChildFailedError`` when they failed and
``ValueError`` on a bad command line. :func:`run` does the same for ``ft_launcher``::

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
    from ft_core.launcher.api import run

    try:
        run(["--nproc-per-node=8", "--max-restarts=3", "train.py", "--lr=0.1"])
    except ChildFailedError as exc:  # a LauncherFailedError: exc.exit_code is the launcher's exit code
        ...

A launch changes process-wide state: it handles (then ignores, for its teardown)
SIGINT, SIGTERM, SIGHUP and SIGQUIT, and sets environment variables for its
workers (``FT_MONITOR_TOKEN``, ``TORCHELASTIC_SIGNALS_TO_HANDLE``, ...).
:func:`restored_process_state` puts both back when it returns, so a later launch
(or the caller's own SIGTERM handler) finds them as they were.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator, Sequence

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

__all__ = ["LauncherFailedError", "restored_process_state", "run"]


class LauncherFailedError(ChildFailedError):
    """The job did not finish: ``exit_code`` is the launcher's (see "Exit codes" in ``docs/launcher.md``)."""

    def __init__(self, exit_code: int) -> None:
        self.exit_code = exit_code
        # torch's ChildFailedError names the failed ranks' processes; here the one process is the launcher
        # (rank -1: not a worker), and its exit summary (stderr) says which ranks failed and why.
        failure = ProcessFailure(local_rank=-1, pid=os.getpid(), exitcode=exit_code, error_file="")
        failure.message = (f"ft_launcher exited {exit_code}: see its summary above and the exit codes in "
                           "docs/launcher.md")
        super().__init__(name="ft_launcher", failures={-1: failure})


@contextlib.contextmanager
def restored_process_state() -> Iterator[None]:
    """Restore the signal handlers and the environment this block changed (only the main thread has handlers)."""
    environ = dict(os.environ)
    main_thread = threading.current_thread() is threading.main_thread()
    handlers = {sig: signal.getsignal(sig) for sig in signal.Signals} if main_thread else {}
    try:
        yield
    finally:
        for sig, handler in handlers.items():
            if handler is not None and signal.getsignal(sig) != handler:  # None: set outside Python, left alone
                signal.signal(sig, handler)
        for name in set(os.environ) - set(environ):
            del os.environ[name]
        for name, value in environ.items():
            if os.environ.get(name) != value:
                os.environ[name] = value


def run(argv: Sequence[str]) -> None:
    """Launch this node's part of a job as ``ft_launcher argv...`` would, in this process; returns when it finished.

    Raises:
        ValueError: the command line is invalid (the launcher printed why).
        LauncherFailedError: a ``ChildFailedError`` when the launcher exits non-zero: the job failed, stopped
            (``exit_code`` 93: do not requeue) or was interrupted (143 after SIGTERM: requeue).
    """
    from ft_core.launcher import main

    try:
        code = main(list(argv))
    except SystemExit as exc:
        if exc.code == 2:  # argparse's and the launcher's "bad command line"; --help exits 0 as torchrun's
            raise ValueError(f"invalid ft_launcher command line: {' '.join(argv)} (the error is printed above; "
                             "see ft_launcher --help)") from None
        raise
    if code != 0:
        raise LauncherFailedError(code)
