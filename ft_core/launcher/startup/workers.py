"""Worker processes that die with the launcher, started plainly or forked from a pre-warmed factory.

Torch's ``SubprocessHandler`` starts each worker in its own session and stops
it with ``killpg``; that covers every exit path of the launcher except its own
SIGKILL, after which the workers would be orphaned. The kernel can cover that
one (``PR_SET_PDEATHSIG``), but it must be requested inside the child before
``exec``. Torch has no parameter for it; its handler factory is the seam, and
:func:`workers_die_with_agent` swaps it in only while workers are started.

The same seam forks workers from a :class:`~ft_core.launcher.startup.prewarm.WorkerFactory`
when one is given: the handler opens the log files exactly as torch does and
hands their descriptors to the factory; the worker it gets back is adopted by
the launcher and asks for the parent-death signal itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import time
from collections.abc import Collection, Iterator
from typing import Any, Optional, cast

import torch.distributed.elastic.multiprocessing.api as mp_api
from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler

from ft_core.launcher.startup.prewarm import WorkerFactory
from ft_core.utils.deadline import wait_until
from ft_core.utils.procutil import die_with_parent_preexec, process_group_members

__all__ = ["kill_process_groups", "signal_process_groups", "wait_for_an_exit", "workers_die_with_agent"]

log = logging.getLogger("ft_core.launcher")

#: How long to wait for SIGKILLed processes to be gone (a process in uninterruptible sleep may never go).
KILL_WAIT = 5.0
#: How often a stop checks whether the workers' process groups are empty (each check scans ``/proc``).
GROUP_POLL = 0.01


class _DieWithAgentHandler(SubprocessHandler):
    """Torch's handler: the worker is forked from ``factory`` if it can, else a new process; either dies with us."""

    def __init__(self, *args: Any, factory: Optional[WorkerFactory], **kwargs: Any) -> None:
        self._factory = factory
        super().__init__(*args, **kwargs)

    def _popen(self, args: tuple, env: dict[str, str]) -> subprocess.Popen:
        if self._factory is not None:
            stdout = self._stdout.fileno() if self._stdout is not None else 1
            stderr = self._stderr.fileno() if self._stderr is not None else 2
            forked = self._factory.fork(args, env, (0, stdout, stderr))
            if forked is not None:
                # Torch only uses the Popen subset AdoptedProcess provides (see ft_core.launcher.startup.prewarm).
                return cast(subprocess.Popen, forked)
        return subprocess.Popen(args=args, env=env, stdout=self._stdout, stderr=self._stderr,
                                start_new_session=True, preexec_fn=die_with_parent_preexec(os.getpid()))

    def close(self, death_sig: Optional[signal.Signals] = None) -> None:
        """As torch's: signal the worker's process group, then close its log files.

        A forked worker leads its own group only once it has run ``setsid``,
        right after the fork and before any user code; a stop in that first
        instant signals the one process there is.
        """
        sig = death_sig or signal.SIGTERM
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)
        for stream in (self._stdout, self._stderr):
            if stream is not None:
                stream.close()


@contextlib.contextmanager
def workers_die_with_agent(factory: Optional[WorkerFactory] = None) -> Iterator[None]:
    """Within this block, workers started by torch's ``start_processes`` die with this process.

    With a ``factory``, they are forked from it (one cycle of that factory);
    the block's exit makes them children of this process.
    """

    def handler_factory(entrypoint: str, args: tuple, env: dict[str, str], stdout: Any, stderr: Any,
                        local_rank_id: int, numa_options: Any = None) -> SubprocessHandler:
        return _DieWithAgentHandler(entrypoint=entrypoint, args=args, env=env, stdout=stdout, stderr=stderr,
                                    local_rank_id=local_rank_id, numa_options=numa_options, factory=factory)

    original = mp_api.get_subprocess_handler
    mp_api.get_subprocess_handler = handler_factory
    try:
        with factory.cycle() if factory is not None else contextlib.nullcontext():
            yield
    finally:
        mp_api.get_subprocess_handler = original


def _killpg(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def signal_process_groups(pgids: Collection[int], sig: signal.Signals) -> None:
    """Send ``sig`` to each of the groups ``pgids`` that still has a live process (its leader dead or not)."""
    for pgid in process_group_members(pgids):
        _killpg(pgid, sig)


def kill_process_groups(pgids: Collection[int], deadline: float) -> list[int]:
    """Wait until the groups ``pgids`` are empty, SIGKILL what is left at the monotonic ``deadline``.

    Torch signals a worker's group only while the worker itself runs; the children of a worker
    that crashed or was killed for a hang (data loader workers blocked in I/O, a forked
    checkpoint writer, a user subprocess) stay in its group and would outlive the cycle, and
    the launcher, and write into the next cycle's files. Returns the pids still alive after
    the SIGKILL (stuck in uninterruptible sleep), normally none.
    """
    def empty() -> bool:
        return not process_group_members(pgids)

    if wait_until(empty, max(0.0, deadline - time.monotonic()), interval=GROUP_POLL):
        return []
    for pgid, pids in process_group_members(pgids).items():
        log.warning("process group %d (pids %s) still alive at the end of the stop timeout: SIGKILL", pgid, pids)
        _killpg(pgid, signal.SIGKILL)
    if wait_until(empty, KILL_WAIT, interval=GROUP_POLL):
        return []
    return [pid for pids in process_group_members(pgids).values() for pid in pids]


def wait_for_an_exit(pids: Collection[int], timeout: float, wake_fds: Collection[int] = ()) -> None:
    """Sleep ``timeout`` seconds, or less: until one of the processes ``pids`` exits or a ``wake_fds`` is readable.

    The agent's monitoring loop waits here instead of sleeping its whole
    ``--monitor-interval``: a pidfd per worker wakes it at a worker's exit
    itself (a crash, or a hung rank the monitor killed), and ``wake_fds`` at
    another node's decision (:mod:`ft_core.launcher.decision_notice`), so a
    restart does not wait for the next pass. Without pidfds (Linux before
    5.3), it waits on ``wake_fds`` only.
    """
    fds: list[int] = []
    try:
        for pid in pids:
            try:
                fds.append(os.pidfd_open(pid))
            except ProcessLookupError:
                return  # gone already: the next pass sees it
        select.select([*fds, *wake_fds], [], [], timeout)
    except (AttributeError, OSError):  # no pidfd_open here (old kernel or Python): poll as torch does
        if wake_fds:
            select.select(list(wake_fds), [], [], timeout)
        else:
            time.sleep(timeout)
    finally:
        for fd in fds:
            os.close(fd)
