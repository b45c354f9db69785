"""Worker processes that die with the launcher.

Torch's ``SubprocessHandler`` starts each worker in its own session and stops
it with ``killpg``; that covers every exit path of the launcher except its own
SIGKILL, after which the workers would be orphaned. The kernel can cover that
one (``PR_SET_PDEATHSIG``), but it must be requested inside the child before
``exec``. Torch has no parameter for it; its handler factory is the seam, and
:func:`workers_die_with_agent` swaps it in only while workers are started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from typing import Any

import torch.distributed.elastic.multiprocessing.api as mp_api
from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler

from ft_core.procutil import die_with_parent

__all__ = ["workers_die_with_agent"]



class _DieWithAgentHandler(SubprocessHandler):
    """Torch's handler, with the worker asking for SIGKILL when the launcher dies."""

    def _popen(self, args: tuple, env: dict[str, str]) -> subprocess.Popen:
        agent_pid = os.getpid()

        def _preexec() -> None:
            die_with_parent(signal.SIGKILL)
            if os.getppid() != agent_pid:  # the launcher died before prctl took effect
                os._exit(1)

        return subprocess.Popen(args=args, env=env, stdout=self._stdout, stderr=self._stderr,
                                start_new_session=True, preexec_fn=_preexec)


def _handler_factory(entrypoint: str, args: tuple, env: dict[str, str], stdout: Any, stderr: Any,
                     local_rank_id: int, numa_options: Any = None) -> SubprocessHandler:
    return _DieWithAgentHandler(entrypoint=entrypoint, args=args, env=env, stdout=stdout, stderr=stderr,
                                local_rank_id=local_rank_id, numa_options=numa_options)


@contextlib.contextmanager
def workers_die_with_agent() -> Iterator[None]:
    """Within this block, workers started by torch's ``start_processes`` die with this process."""
    original = mp_api.get_subprocess_handler
    mp_api.get_subprocess_handler = _handler_factory
    try:
        yield
    finally:
        mp_api.get_subprocess_handler = original
