"""The writer thread: serialises a snapshot and writes it to a slot, off the training thread.

The training thread only copies the state (:func:`copy_state`: every tensor cloned to
host memory, so training may change its own tensors at once; CUDA tensors into reused
pinned buffers on a side stream, without waiting for the copies) and hands the copy over
(:meth:`SnapshotWriter.submit`, which never waits). The thread pickles it with
``torch.save`` straight into the slot's file and writes the slot's manifest. One
snapshot is written at a time: a snapshot due while the previous one is still being
written is skipped (and counted), never queued, so a slow write cannot hold memory or
steps back.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
from typing import Any, Optional

from ft_core.snapshots.slots import Snapshot, SnapshotSlots

__all__ = ["SnapshotWriter", "copies_done", "copy_state", "side_stream"]

log = logging.getLogger("ft_core.snapshots")


def copy_state(state: Any, reuse: Any = None, stream: Any = None) -> Any:
    """``state`` with every tensor replaced by a detached copy in host memory (containers rebuilt, other values kept).

    Tensors sharing storage are copied once and keep sharing it (tied weights stay tied).
    ``reuse``: a previous copy of a state of the same structure; its tensors of the same
    shape and dtype are overwritten in place (a plain memory copy, without allocating
    and faulting in fresh pages), so it must no longer be in use.

    ``stream``: a CUDA stream (:func:`side_stream`); the tensors on its device are then copied on
    it without blocking, into pinned host buffers (``reuse``'s when pinned), so this returns before
    they are copied: the caller records an event on ``stream`` and waits for it before reading the
    copy (:func:`copies_done`). Without it, every copy is done when this returns.
    """
    import torch

    copies: dict[tuple[Any, ...], torch.Tensor] = {}

    def copy(value: Any, old: Any) -> Any:
        if isinstance(value, torch.Tensor):
            key = (value.device, value.untyped_storage().data_ptr(), value.storage_offset(), value.dtype,
                   tuple(value.shape), tuple(value.stride()))
            found = copies.get(key)
            if found is None:
                pinned = stream is not None and value.device == stream.device
                if isinstance(old, torch.Tensor) and old.device.type == "cpu" and old.dtype == value.dtype and \
                        old.shape == value.shape and old.is_contiguous() and old.data_ptr() not in reused and \
                        (not pinned or old.is_pinned()):
                    found = old
                    reused.add(old.data_ptr())
                elif pinned:
                    found = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
                else:
                    found = value.detach().to("cpu", copy=True)
                    copies[key] = found
                    return found
                if pinned:
                    # The training's allocator must not hand the tensor's memory out while the side stream reads it.
                    value.record_stream(stream)
                    with torch.cuda.stream(stream):
                        found.copy_(value.detach(), non_blocking=True)
                else:
                    found.copy_(value.detach())
                copies[key] = found
            return found
        if isinstance(value, dict):
            olds = old if isinstance(old, dict) else {}
            copied = {key: copy(item, olds.get(key)) for key, item in value.items()}
            return collections.OrderedDict(copied) if isinstance(value, collections.OrderedDict) else copied
        if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
            previous: list[Any] = list(old) if isinstance(old, (list, tuple)) and len(old) == len(value) \
                else [None] * len(value)
            items = [copy(item, before) for item, before in zip(value, previous)]
            return items if isinstance(value, list) else tuple(items)
        return value

    reused: set[int] = set()
    if stream is not None:  # the copies read what the training's stream has queued so far
        stream.wait_stream(torch.cuda.current_stream(stream.device))
    return copy(state, reuse)


def side_stream() -> Any:
    """A new CUDA stream on the current device for :func:`copy_state`; None without CUDA (CPU-only torch too)."""
    import torch

    return torch.cuda.Stream() if torch.cuda.is_available() else None


def copies_done(stream: Any) -> Any:
    """An event after the copies :func:`copy_state` queued on ``stream``; wait for it before reading the copy.

    The training's stream waits for it too, on the GPU: its next kernels (an optimizer step
    changing the tensors in place) run after the copies, while the training thread goes on.
    """
    import torch

    event = torch.cuda.Event()
    event.record(stream)
    torch.cuda.current_stream(stream.device).wait_event(event)
    return event


class SnapshotWriter:
    """Writes submitted snapshots of one rank in a daemon thread, one at a time."""

    def __init__(self, slots: SnapshotSlots, lineage: str, *, keep_slot: Optional[int] = None,
                 discard: bool = False) -> None:
        """``discard``: first remove every slot but ``keep_slot`` (after a resume: the slots not resumed from)."""
        self.slots = slots
        self.lineage = lineage
        #: Snapshots skipped because the previous write was still running.
        self.skipped = 0
        #: The newest snapshot written by this writer.
        self.last: Optional[Snapshot] = None
        #: The exception of the last failed write (the job goes on; disk checkpoints are the source of truth).
        self.error: Optional[BaseException] = None
        self._keep_slot = keep_slot
        #: ``(cpu_s, wall_s)`` of the newest write that completed: the writer thread's CPU time and the wall time.
        self.last_cost: Optional[tuple[float, float]] = None
        self._write_started: Optional[float] = None
        self._pending: Optional[tuple[int, Any, Any]] = None
        self._discard = discard
        self._busy = False
        self._closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="ft-snapshot-writer", daemon=True)
        self._thread.start()

    def submit(self, step: int, state: Any, ready: Any = None) -> bool:
        """Hand over ``state`` (already a copy: :func:`copy_state`); False when skipped (a write is running).

        ``ready``: the CUDA event of its copies still in flight (:func:`copies_done`); the thread waits for it.
        """
        with self._cond:
            if self._closed:
                return False
            if self._busy or self._pending is not None:
                self._skip(step)
                return False
            self._pending = (step, state, ready)
            self._cond.notify_all()
            return True

    def skip(self, step: int) -> None:
        """Count (and warn about) the snapshot of ``step`` not taken: the previous one is still being written."""
        with self._cond:
            self._skip(step)

    def _skip(self, step: int) -> None:
        self.skipped += 1
        if self.skipped in (1, 10, 100) or self.skipped % 1000 == 0:
            log.warning("snapshot of step %d skipped: the previous one is still being written (%d skipped "
                        "so far); take snapshots less often (snapshot_every)", step, self.skipped)

    @property
    def idle(self) -> bool:
        """Nothing pending or being written: a submitted state is free again."""
        with self._cond:
            return not self._busy and self._pending is None

    def cost(self) -> Optional[tuple[float, float]]:
        """``(cpu_s, wall_s)`` of the newest write; while one runs, its time so far for both (it lasts at least that)."""
        with self._cond:
            started, last = self._write_started, self.last_cost
        if started is None:
            return last
        elapsed = time.perf_counter() - started
        return (max(elapsed, last[0]) if last else elapsed), elapsed

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait until nothing is pending or being written; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._busy and self._pending is None, timeout)

    def close(self, timeout: Optional[float] = 60.0) -> None:
        """Finish the write in progress (if any) and stop the thread."""
        self.wait(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)

    def _run(self) -> None:
        import torch

        if self._discard:  # before any write: one submitted meanwhile waits for it
            self.slots.discard(keep=self._keep_slot)
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None or self._closed)
                if self._pending is None:
                    return
                step, state, ready = self._pending
                self._pending = None
                self._busy = True
            cpu, wall = time.thread_time(), time.perf_counter()
            with self._cond:
                self._write_started = wall
            try:
                if ready is not None:
                    ready.synchronize()  # the device-to-host copies: the only wait, and off the training thread
                slot = self._target_slot()
                self.last = self.slots.write(slot, step, self.lineage, functools.partial(torch.save, state))
                self.error = None
                with self._cond:
                    self.last_cost = (time.thread_time() - cpu, time.perf_counter() - wall)
            except Exception as exc:  # noqa: BLE001 - a failed snapshot must not end training
                self.error = exc
                log.warning("snapshot of step %d failed: %s: %s", step, type(exc).__name__, exc)
            finally:
                del state, ready
                with self._cond:
                    self._busy = False
                    self._write_started = None
                    self._cond.notify_all()

    def _target_slot(self) -> int:
        if self.last is not None:
            return 1 - self.last.slot  # double buffering: never the newest
        if self._keep_slot is not None:
            return 1 - self._keep_slot  # the snapshot resumed from stays until a newer one is whole
        return self.slots.next_slot()
