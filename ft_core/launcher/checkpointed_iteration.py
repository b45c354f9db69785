"""Training progress as the launcher sees it: the latest checkpointed iteration.

Two sources feed it: ``checkpoint_reported`` events that ranks send through
``RankMonitorClient.report_checkpoint`` (recorded by the node monitor), and an
optional file holding one integer (``checkpoint_iteration_file``, e.g.
Megatron's ``latest_checkpointed_iteration.txt``). A restart cycle made "no
progress" unless the latest checkpointed iteration grew by at least
``min_progress_iterations`` since the previous cycle ended (:func:`made_progress`).
"""

from __future__ import annotations

import logging
from typing import Optional

__all__ = ["CheckpointedIterationTracker", "made_progress"]

log = logging.getLogger("ft_core.launcher")


def made_progress(latest: int, mark: int, min_iterations: int) -> bool:
    """Whether the job progressed: ``latest`` is the checkpointed iteration now, ``mark`` the one when
    the previous cycle ended (-1 for "none known" in both).

    As in NVRx, progress means an increase of at least ``min_iterations``. Without
    a mark, any checkpoint counts: the first one seen cannot be compared with anything.
    """
    if latest < 0:
        return False
    return mark < 0 or latest - mark >= min_iterations


class CheckpointedIterationTracker:
    """The highest checkpointed iteration observed on this node."""

    def __init__(self, iteration_file: Optional[str] = None) -> None:
        self.iteration_file = iteration_file
        self.latest: Optional[int] = None
        self._file_warned = False

    @property
    def active(self) -> bool:
        """True once there is a progress signal at all; without one "no progress" cannot be judged."""
        return self.iteration_file is not None or self.latest is not None

    def observe(self, iteration: int) -> bool:
        """Record a checkpointed iteration; True if it is newer than anything seen before."""
        if self.latest is None or iteration > self.latest:
            self.latest = iteration
            return True
        return False

    def poll_file(self) -> Optional[int]:
        """Read the iteration file; returns the iteration if it is new, else None."""
        if self.iteration_file is None:
            return None
        try:
            with open(self.iteration_file, encoding="utf-8") as handle:
                text = handle.read().strip()
        except FileNotFoundError:
            return None  # no checkpoint yet
        except OSError as exc:
            self._warn_once(f"cannot read checkpoint_iteration_file {self.iteration_file}: {exc}")
            return None
        try:
            iteration = int(text)
        except ValueError:
            self._warn_once(f"checkpoint_iteration_file {self.iteration_file} does not hold an integer: "
                            f"{text[:40]!r}")
            return None
        return iteration if self.observe(iteration) else None

    def _warn_once(self, message: str) -> None:
        if not self._file_warned:
            log.warning(message)
            self._file_warned = True
