"""Load the newest checkpoint that is whole, loads and holds finite numbers; every rank the same one.

A resume from a bad checkpoint (torn by a kill, truncated by a full disk, holding
NaN weights) fails the same way after every restart. Before a resume the
integrations call :func:`load_verified` with the checkpoint they were asked to
load and the older ones they could fall back to, newest first. Each candidate in
turn is checked (its manifest, :func:`ft_core.checkpoint_manifest.verify`), loaded,
and its floating-point tensors checked for NaN and infinity; the first that
passes on *every* rank is used (the ranks agree through the default process
group, one small all-reduce per candidate: :func:`ft_core.all_ranks.all_ranks_ok`;
so no rank resumes from another checkpoint than its peers). Every rejected candidate is reported with its reason:
logged, and under ``ft_launcher`` written as a ``checkpoint_rejected`` record, and
the checkpoint used as a ``checkpoint_loaded`` one (:mod:`ft_core.rank_records`):
a later fault's fingerprint names it, so the launcher can mark it bad.

After the resume, :class:`LossWatch` checks the loss of the first steps: a
non-finite one raises :class:`~ft_core.fault_policy.NonFiniteLossError`, the
fault that marks the checkpoint bad.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Callable, Sequence
from typing import Any, Optional

from ft_core.all_ranks import all_ranks_ok
from ft_core.checkpoint_manifest import Rejection, Version, checksum, read_manifest, verified_version
from ft_core.events import CheckpointLoaded, CheckpointRejected
from ft_core.fault_policy import FaultPolicy, NonFiniteLossError
from ft_core.finite import nonfinite_tensors
from ft_core.rank_records import current_cycle, write_rank_record

__all__ = ["LoadResult", "LossWatch", "NoGoodCheckpointError", "choose_checkpoint", "fallback_candidates",
           "load_verified", "nonfinite_tensors"]

log = logging.getLogger("ft_integrations.checkpoint")


class NoGoodCheckpointError(RuntimeError):
    """Every candidate was rejected: resuming would load a bad checkpoint."""

    def __init__(self, rejections: Sequence[Rejection]) -> None:
        self.rejections = list(rejections)
        super().__init__("no checkpoint passed verification: " + "; ".join(
            f"{r.path}: {r.reason}" for r in self.rejections))


@dataclasses.dataclass
class LoadResult:
    """The state loaded, the checkpoint it came from, and the newer ones skipped (newest first).

    ``step``: the global step its manifest says it holds (None: no manifest, or none recorded).
    """

    state: Any
    path: str
    rejected: list[Rejection]
    step: Optional[int] = None


def fallback_candidates(requested: str, pattern_suffix: str = ".ckpt") -> list[str]:
    """The older checkpoints beside ``requested`` that have manifests, newest (highest step) first.

    Only checkpoints this suite wrote (with a manifest) are fallbacks: a file of
    unknown origin in the same directory is never loaded in its place.
    """
    directory = os.path.dirname(os.path.abspath(requested))
    found = []
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if name.endswith(pattern_suffix) and os.path.abspath(path) != os.path.abspath(requested):
            try:
                manifest = read_manifest(path)
            except (OSError, ValueError):
                continue
            if manifest is not None and manifest.versions:
                newest = manifest.versions[0]
                found.append((newest.global_step if newest.global_step is not None else -1, newest.written, path))
    return [path for _, _, path in sorted(found, reverse=True)]


def load_verified(requested: str, fallbacks: Sequence[str], load: Callable[[str], Any], *,
                  weights: Optional[Callable[[Any], Any]] = None, require_manifest: Optional[bool] = None,
                  split_checksums: bool = False, agree_before_load: bool = False) -> LoadResult:
    """Load the first of ``[requested, *fallbacks]`` that passes on every rank (see the module docstring).

    ``weights``: the part of a loaded state whose floating-point tensors must be finite
    (the model's and the optimizer's: not, say, a callback's ``inf`` best score); None
    skips the finite check.

    ``require_manifest``: reject a candidate without a manifest; by default only
    when there are fallbacks (a job that writes manifests), so a checkpoint
    written before manifests existed still loads when it is the only one.

    ``split_checksums``: the ranks of the default process group share the CRC-32 reads
    of a checkpoint directory (each checks every file's size, and the checksums of its
    share of the files; the agreement combines them): a shared checkpoint is read once
    for the check, not once per rank. A rank then names only the corruption it saw;
    the others reject the candidate as "rejected by another rank".

    ``agree_before_load``: the ranks also agree on the manifest check before ``load``
    (a collective load, such as ``torch.distributed.checkpoint``'s, must be entered by
    every rank or by none).

    A file marked bad condemns its content under any name: a later candidate with the
    same bytes (Lightning's ``last.ckpt`` and the top-k copy of the same save) is
    skipped too, instead of costing one more restart to be marked in turn.

    Raises:
        NoGoodCheckpointError: every candidate was rejected (on some rank).
    """
    strict = bool(fallbacks) if require_manifest is None else require_manifest
    share = _share() if split_checksums else (0, 1)
    rejected: list[Rejection] = []
    condemned: dict[tuple[int, int], str] = {}  # the (size, CRC-32) of files marked bad -> the name marked
    for candidate in [requested, *fallbacks]:
        found = verified_version(candidate, require_manifest=strict, share=share)
        problem = found if isinstance(found, Rejection) else _copy_of_condemned(candidate, found, condemned)
        if isinstance(found, Rejection) and found.reason.startswith("marked bad") and os.path.isfile(candidate):
            condemned.setdefault(checksum(candidate), candidate)
        state = None
        if agree_before_load and not all_ranks_ok(problem is None):
            problem = problem or Rejection(candidate, "rejected by another rank")
        if problem is None:
            try:
                state = load(candidate)
            except Exception as exc:  # noqa: BLE001 - any failure to load is a reason to skip it
                problem = Rejection(candidate, f"does not load: {type(exc).__name__}: {exc}")
        if problem is None and weights is not None:
            bad = nonfinite_tensors(weights(state))
            if bad:
                problem = Rejection(candidate, f"non-finite values in {', '.join(bad)}")
        if all_ranks_ok(problem is None):
            if rejected:
                log.warning("resuming from %s instead of %s: %s", candidate, requested,
                            "; ".join(f"{r.path}: {r.reason}" for r in rejected))
            result = LoadResult(state, candidate, rejected, None if isinstance(found, Rejection) or found is None
                                else found.global_step)
            _record(result)
            return result
        rejected.append(problem or Rejection(candidate, "rejected by another rank"))
        log.warning("checkpoint %s rejected: %s", candidate, rejected[-1].reason)
    _record(LoadResult(None, "", rejected))
    raise NoGoodCheckpointError(rejected)


def choose_checkpoint(candidates: Sequence[str], *, require_manifest: Optional[bool] = None) -> Optional[str]:
    """The first of ``candidates`` (newest first) whose manifest verifies on every rank; None when there are none.

    For a loop that loads by itself: :func:`load_verified` without the load (so without the
    finite check), with the same agreement across ranks and the same ``checkpoint_rejected``
    / ``checkpoint_loaded`` records for ``ft_launcher`` (call it on every rank). Start a
    :class:`LossWatch` after loading what it returns. Raises :class:`NoGoodCheckpointError`
    when every candidate is rejected.

    Example (every rank)::

        paths = sorted(glob.glob("ckpt/step*.pt"), key=step_of, reverse=True)   # newest first
        path = choose_checkpoint(paths)              # verified, agreed, recorded
        if path is not None:
            state = torch.load(path)
    """
    if not candidates:
        return None
    return load_verified(candidates[0], candidates[1:], lambda _path: None, require_manifest=require_manifest).path


def _share() -> tuple[int, int]:
    """``(rank, world size)`` of the default process group; ``(0, 1)`` without one (each process checks all)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _copy_of_condemned(candidate: str, found: Optional[Version],
                       condemned: dict[tuple[int, int], str]) -> Optional[Rejection]:
    """A rejection when the file ``candidate`` holds the very bytes of a file marked bad in this load.

    ``found``: the manifest version the candidate was just verified to hold: its size and CRC-32
    are the file's, so the file is read again only without one (no manifest).
    """
    if not condemned or not os.path.isfile(candidate):
        return None
    content = (found.files[0].size, found.files[0].crc32) if found is not None and len(found.files) == 1 \
        else checksum(candidate)
    marked = condemned.get(content)
    return None if marked is None else Rejection(candidate, f"marked bad: the same content as {marked}")


def _rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def _record(result: LoadResult) -> None:
    """This rank's ``checkpoint_rejected`` records and, when one was used, its ``checkpoint_loaded`` record."""
    rank, cycle = _rank(), current_cycle()
    for rejection in result.rejected:
        write_rank_record(CheckpointRejected(rank=rank, cycle=cycle, checkpoint=os.path.abspath(rejection.path),
                                             reason=rejection.reason))
    if result.path:
        write_rank_record(CheckpointLoaded(rank=rank, cycle=cycle, checkpoint=os.path.abspath(result.path),
                                           step=result.step))


class LossWatch:
    """Raise :class:`~ft_core.fault_policy.NonFiniteLossError` for a NaN or infinite loss right after a resume.

    A checkpoint that loads and holds finite weights can still be bad (a corrupt
    optimizer state, a scaler at infinity): the first steps after it say so. The
    watch covers the ``steps`` steps after the resume (the fault policy's
    ``suspect_checkpoint_steps``); later, a non-finite loss is the training's own
    business (a loss spike), not the checkpoint's, and is left alone.

    Example::

        >>> watch = LossWatch(resumed_step=20, checkpoint="/ckpt/step=20.ckpt", steps=10)
        >>> watch.check(0.5, step=21)
        >>> watch.check(float("nan"), step=22)
        Traceback (most recent call last):
        ...
        ft_core.fault_policy.NonFiniteLossError: non-finite loss nan at step 22, 2 step(s) after resuming from /ckpt/step=20.ckpt
        >>> watch.check(float("nan"), step=31)  # past the window: not the checkpoint's fault
    """

    def __init__(self, resumed_step: int, checkpoint: Optional[str] = None,
                 steps: int = FaultPolicy.suspect_checkpoint_steps) -> None:
        self.resumed_step, self.checkpoint, self.steps = resumed_step, checkpoint, steps

    def watching(self, step: int) -> bool:
        """True while ``step`` is within the window after the resume (the caller may skip reading the loss)."""
        return 0 <= step - self.resumed_step <= self.steps

    def check(self, loss: Any, step: int) -> None:
        """Check ``loss`` (a float or a tensor) of ``step``; raises when non-finite inside the window."""
        if not self.watching(step):
            return
        value = float(loss.detach().float().sum()) if hasattr(loss, "detach") else float(loss)
        if not math.isfinite(value):
            raise NonFiniteLossError(value, step, step - self.resumed_step, self.checkpoint)
