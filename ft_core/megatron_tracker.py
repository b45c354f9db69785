"""Megatron-LM's checkpoints (``iter_N`` directories, the tracker file): which one a job resumed from; moving back.

Megatron-LM writes each checkpoint to ``<save>/iter_NNNNNNN`` and then points
``<save>/latest_checkpointed_iteration.txt`` (the tracker) at it; a resume from
``--load`` loads the tracker's checkpoint and continues at its iteration. An
unmodified Megatron-LM job (its own ``ft_integration``, through the NVRx alias)
never says which checkpoint it loaded, so the launcher infers it
(:func:`inferred_resume`): the tracker of ``--load`` when the cycle started,
confirmed by the first iteration the cycle's ranks reported (a job that loaded
``iter_N`` reports ``N`` first; one that started over, or from an older
checkpoint, reports less). When the fault policy condemns that checkpoint, the job
would load it again at the next restart; :func:`roll_back` points the tracker at
the newest older ``iter_M`` that is not marked bad, atomically, keeping the
tracker as it was in ``latest_checkpointed_iteration.txt.bad-<N>``.

The one home of these names (:data:`TRACKER_FILENAME`, :func:`checkpoint_dir`,
:func:`iteration_of`): the launcher and the Megatron integration
(:mod:`ft_integrations.megatron.checkpoints`, its hooks) import them from here. Torch-free.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Sequence
from typing import Optional

from ft_core.checkpoint_manifest import has_bad_mark
from ft_core.utils.fileutil import atomic_write_text

__all__ = ["TRACKER_FILENAME", "checkpoint_dir", "inferred_resume", "iteration_of", "load_dir", "roll_back",
           "tracker_iteration"]

log = logging.getLogger("ft_core.launcher")

#: Megatron-LM's tracker file in ``--save``/``--load``: the iteration of the latest complete persistent checkpoint.
TRACKER_FILENAME = "latest_checkpointed_iteration.txt"
_ITER_DIR = re.compile(r"^iter_(\d{7,})$")


def checkpoint_dir(save_dir: str, iteration: int) -> str:
    """Megatron's directory of ``iteration``'s checkpoint: ``<save_dir>/iter_NNNNNNN``."""
    return os.path.join(save_dir, f"iter_{iteration:07d}")


def iteration_of(path: str) -> Optional[int]:
    """The iteration of an ``iter_NNNNNNN`` directory; None for another name."""
    match = _ITER_DIR.match(os.path.basename(os.path.normpath(path)))
    return int(match.group(1)) if match else None


def load_dir(args: Sequence[str]) -> Optional[str]:
    """Megatron-LM's ``--load`` directory in a worker's command line (absolute), the last one given; None without.

    The launcher's one source for where a Megatron-LM job resumes from: the tracker
    Megatron-LM reads is in it (``--save`` is where it writes, often the same directory).
    """
    found = None
    for i, arg in enumerate(args):
        if arg == "--load" and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith("--load="):
            found = arg.split("=", 1)[1]
    return os.path.abspath(found) if found else None


def tracker_iteration(directory: str) -> Optional[int]:
    """The tracker's iteration; None when absent, unreadable or not a number (Megatron's ``release``)."""
    try:
        with open(os.path.join(directory, TRACKER_FILENAME), encoding="utf-8") as handle:
            return int(handle.read().strip())
    except (OSError, ValueError):
        return None


def inferred_resume(directory: Optional[str], tracker: Optional[int],
                    first_iterations: Iterable[Optional[int]]) -> Optional[tuple[str, int]]:
    """``(checkpoint, iteration)`` a Megatron-LM cycle resumed from, or None when nothing confirms one.

    ``tracker``: the tracker of ``directory`` (``--load``) when the cycle started;
    ``first_iterations``: the first iteration each rank reported in the cycle. The cycle
    resumed from ``iter_<tracker>`` when that directory exists and no rank reported an
    earlier iteration (a fresh start, ``--finetune`` or ``--ckpt-step`` of an older one
    report less); without any reported iteration nothing is inferred.
    """
    reported = [i for i in first_iterations if i is not None]
    if directory is None or tracker is None or not reported or min(reported) < tracker:
        return None
    path = checkpoint_dir(directory, tracker)
    return (path, tracker) if os.path.isdir(path) else None


def roll_back(checkpoint: str) -> Optional[int]:
    """Point the tracker beside ``checkpoint`` (a condemned ``iter_N``) at the newest older good ``iter_M``: ``M``.

    Only while the tracker still names ``N`` (another node may have moved it already:
    the job acts on one decision everywhere, and the same result is written). "Good"
    means not marked bad; Megatron-LM verifies nothing more, and if ``iter_M`` is bad
    too, the next fault from it condemns it in turn. The tracker as it was is kept in
    ``<tracker>.bad-<N>``. None (and nothing changed) when there is no such ``iter_M``.
    """
    directory, bad = os.path.dirname(os.path.normpath(checkpoint)), iteration_of(checkpoint)
    tracker = os.path.join(directory, TRACKER_FILENAME)
    if bad is None or tracker_iteration(directory) != bad:
        return None
    older = [i for i in (iteration_of(name) for name in os.listdir(directory)) if i is not None and i < bad
             and os.path.isdir(checkpoint_dir(directory, i)) and not has_bad_mark(checkpoint_dir(directory, i))]
    if not older:
        log.warning("no checkpoint older than %s in %s: Megatron-LM will load it again", checkpoint, directory)
        return None
    with open(tracker, encoding="utf-8") as handle:
        atomic_write_text(f"{tracker}.bad-{bad}", handle.read())
    atomic_write_text(tracker, f"{max(older)}\n")
    return max(older)
