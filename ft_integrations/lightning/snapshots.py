"""``FaultToleranceCallback(snapshot_every=...)``: in-memory snapshots of a Lightning run (see ``docs/snapshots.md``).

A snapshot is the checkpoint Lightning would write at that step, built the way it builds
one (``trainer._checkpoint_connector.dump_checkpoint()``, as ``ModelCheckpoint`` does,
with the callbacks' states and the loops' progress) plus the RNG states, taken at the end
of every ``snapshot_every``-th training batch (``"auto"``, the default: every so many
steps that their measured cost stays within 2 % of the step time, see
:mod:`ft_core.snapshots.interval`; the interval is kept in the callback's state). The training thread only copies its
tensors; the rank.s snapshot slots are written by a thread (:mod:`ft_core.snapshots`).

On a restart the ranks agree on the newest snapshot every rank holds; when it is newer
than the disk checkpoint, it becomes the checkpoint Lightning restores from. The choice is
made when Lightning is about to load the disk checkpoint (``CheckpointIO.load_checkpoint``,
comparing with the step its manifest names, so a newer snapshot spares the disk load), or,
without a disk checkpoint to load or a manifest naming its step, in ``on_fit_start``
(after Lightning restored the model and callbacks, before the loops and optimizers).
Disk checkpoints stay the source of truth.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Mapping
from typing import Any, Optional

from ft_core.all_ranks import all_ranks_max, all_ranks_ok
from ft_core.checkpoint_manifest import read_manifest
from ft_core.events import ResumeSource
from ft_core.jobdir import MONITOR_SOCKET_ENV
from ft_core.snapshots.condemned import snapshot_name
from ft_core.snapshots.interval import AUTO, SnapshotEvery, snapshot_every_arg
from ft_core.snapshots.node import NodeSnapshots
from ft_integrations.checkpoint_guard import LoadResult
from ft_integrations.lightning._pl import pl, rank_zero_warn
from ft_integrations.lightning.checkpoint_io import checkpoint_weights

__all__ = ["SNAPSHOT_EVERY_KEY", "LightningSnapshots", "load_learned_every", "save_learned_every",
           "snapshot_every_arg"]

log = logging.getLogger("ft_integrations.lightning")

_RNG_KEY = "ft_rng_states"
#: The key of the interval ``snapshot_every="auto"`` learned, in the callback's state: a resumed run keeps it.
SNAPSHOT_EVERY_KEY = "snapshot_every"


def _rng_states() -> dict[str, Any]:
    import torch

    states: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy

        states["numpy"] = numpy.random.get_state()
    except ImportError:
        pass
    return states


def _set_rng_states(states: dict[str, Any]) -> None:
    import torch

    torch.set_rng_state(states["torch"])
    random.setstate(states["python"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    if "numpy" in states:
        import numpy

        numpy.random.set_state(states["numpy"])


class LightningSnapshots:
    """The snapshots of one rank of a ``Trainer``: taken every ``every`` steps, resumed from when newer."""

    def __init__(self, node: NodeSnapshots, learn_step: Optional[int] = None) -> None:
        self.node = node
        #: The step whose end the callback learns timeouts at: a snapshot is taken there too, so the
        #: learned step (or heartbeat) timeout has seen one (a snapshot first taken after learning, longer
        #: than the steps learned from, would be killed as a hang).
        self.learn_step = learn_step
        self._rng: Optional[dict[str, Any]] = None
        #: True while this object builds a checkpoint: the callback's ``on_save_checkpoint`` is not a save then.
        self.taking = False

    @classmethod
    def for_trainer(cls, trainer: pl.Trainer, every: SnapshotEvery, learn_step: Optional[int] = None
                    ) -> Optional[LightningSnapshots]:
        """None when this run has no snapshot directory (not launched by ``ft_launcher``): with a warning
        when ``every`` is a number, quietly for ``"auto"`` (the default: off without ft_launcher).

        Under ``ft_launcher`` a collective (every rank, in ``setup``): snapshots are on for every rank or
        for none, since taking and resuming from them are collectives (a node whose launcher could make
        no snapshot directory would leave the others waiting in them).
        """
        node = NodeSnapshots.for_rank(trainer.global_rank, trainer.world_size, every)
        if os.environ.get(MONITOR_SOCKET_ENV):
            some_have, some_lack = all_ranks_max([int(node is not None), int(node is None)])
            if some_have and some_lack:
                rank_zero_warn(f"FaultToleranceCallback(snapshot_every={every!r}): not every rank has a snapshot "
                               "directory (ft_launcher could not make one in its node's /dev/shm): snapshots are off on "
                               "every rank")
                return None
        if node is None:
            if every == AUTO:
                log.debug("snapshot_every='auto': no snapshot directory on this node (not ft_launcher): snapshots are off")
            else:
                rank_zero_warn(f"FaultToleranceCallback(snapshot_every={every}): no snapshot directory on this node "
                               "(snapshots need ft_launcher, which keeps them across worker restarts): snapshots "
                               "are off")
            return None
        if trainer.strategy.restore_checkpoint_after_setup:
            rank_zero_warn(f"FaultToleranceCallback(snapshot_every={every}): {type(trainer.strategy).__name__} "
                           "restores checkpoints after on_fit_start, where a snapshot is chosen: snapshots are off")
            return None
        return cls(node, learn_step)

    def instead_of(self, path: str) -> Optional[dict[str, Any]]:
        """When a resume is about to load the disk checkpoint ``path`` (every rank): the agreed snapshot's
        state when it is newer than the step ``path``'s manifest names, so the disk checkpoint is not loaded.

        None (load ``path``) when it is not, or when some rank cannot read ``path``'s step from its
        manifest: then :meth:`resume` decides after the load.
        """
        if self.node.source is not None:
            return None  # decided already
        try:
            manifest = read_manifest(path)
        except (OSError, ValueError):
            manifest = None
        step = manifest.global_step if manifest is not None else None
        if not all_ranks_ok(step is not None):
            return None
        state = self.node.resume(step, weights=checkpoint_weights)
        if state is not None:
            self._rng = state.pop(_RNG_KEY, None)
        return state

    def resume(self, trainer: pl.Trainer) -> bool:
        """At ``on_fit_start`` on every rank: resume from the agreed snapshot when newer than what Lightning loaded.

        Lightning has restored the model and callbacks, not yet the loops and optimizers. When
        :meth:`instead_of` decided already (the snapshot is Lightning's loaded checkpoint, or the disk
        checkpoint was newer), only the RNG states are left to restore. Returns True when the run
        resumes from a snapshot.
        """
        if self.node.source is None:
            connector = trainer._checkpoint_connector
            loaded = connector._loaded_checkpoint
            step = loaded.get("global_step") if loaded else None
            state = self.node.resume(None if step is None else int(step), weights=checkpoint_weights)
            if state is not None:
                self._rng = state.pop(_RNG_KEY, None)
                connector._loaded_checkpoint = state
                # What _restore_modules_and_callbacks did with the disk checkpoint; loops and optimizers follow.
                connector.restore_model()
                connector.restore_datamodule()
                connector.restore_callbacks()
        if self._rng is not None:
            _set_rng_states(self._rng)
            self._rng = None
        return self.node.source is ResumeSource.SNAPSHOT

    def on_fit_start(self, trainer: pl.Trainer) -> Optional[LoadResult]:
        """:meth:`resume`, then :meth:`resumed`: the snapshot the run resumed from, for the NaN watch; else None."""
        return self.resumed() if self.resume(trainer) else None

    def resumed(self) -> Optional[LoadResult]:
        """The snapshot the run resumed from (its name and step), for the NaN watch as after a disk load; else None.

        A snapshot's resume is guarded as a disk checkpoint's: a non-finite loss in the steps after it
        raises :class:`~ft_core.fault_policy.NonFiniteLossError`, and the fault policy condemns the snapshot.
        """
        agreement = self.node.agreement
        snapshot = agreement.snapshot if agreement is not None and self.node.source is ResumeSource.SNAPSHOT else None
        if snapshot is None:
            return None
        return LoadResult(None, snapshot_name(snapshot.step, snapshot.lineage), [], snapshot.step)

    def maybe_take(self, trainer: pl.Trainer) -> bool:
        """At the end of a training batch: take a snapshot when one is due (on every rank: it may gather)."""
        step = trainer.global_step
        if step == self.learn_step and self.node.due(step, every=1):
            return self.node.take(step, lambda: self._checkpoint(trainer))
        return self.node.maybe_save(step, lambda: self._checkpoint(trainer))

    @property
    def learned_every(self) -> Optional[int]:
        """The interval ``snapshot_every="auto"`` learned, 0 when it found no room for snapshots (for the callback's
        state: a resumed run keeps it); else None."""
        if self.node.off:
            return 0
        auto = self.node.auto
        return auto.every if auto is not None and auto.learned else None

    def restore_every(self, every: Any) -> None:
        """The interval an earlier run of the job learned, or 0: it found no room (``"auto"`` only: a number
        given by the user stays)."""
        if self.node.auto is None:
            return
        if every == 0 and type(every) is int:
            if self.node.slots.rank == 0:
                log.info("snapshot_every='auto': in-memory snapshots stay off: an earlier run of this job found no "
                         "room for them")
            self.node.turn_off()
        else:
            self.node.auto.restore(every)

    def _checkpoint(self, trainer: pl.Trainer) -> dict[str, Any]:
        self.taking = True
        try:
            checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        finally:
            self.taking = False
        checkpoint[_RNG_KEY] = _rng_states()
        return checkpoint

    def close(self) -> None:
        self.node.close()


def save_learned_every(snapshots: Optional[LightningSnapshots], state: dict[str, Any]) -> dict[str, Any]:
    """The callback's ``state`` with the interval ``"auto"`` learned (:attr:`LightningSnapshots.learned_every`)."""
    every = snapshots.learned_every if snapshots is not None else None
    return state if every is None else {**state, SNAPSHOT_EVERY_KEY: every}


def load_learned_every(snapshots: Optional[LightningSnapshots], state: Mapping[str, Any]) -> Mapping[str, Any]:
    """The callback's ``state`` without the learned interval, which goes to ``snapshots`` (when on in this run)."""
    if not isinstance(state, Mapping) or SNAPSHOT_EVERY_KEY not in state:
        return state
    rest = dict(state)
    every = rest.pop(SNAPSHOT_EVERY_KEY)
    if snapshots is not None:
        snapshots.restore_every(every)
    return rest
