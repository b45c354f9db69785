"""Never restart in vain: what to do after a fault, from the fingerprints of the job's faults so far.

A restart helps a transient fault (a node's hiccup, a killed process). It cannot
help a deterministic one: the same exception at the same place and iteration,
from the same checkpoint, comes back after every restart and spends the whole
budget (Megatron-LM users watched 44 identical restart cycles on a corrupt
checkpoint). Every cycle-ending fault gets a :class:`Fingerprint`; :func:`decide_fault`
reads the job's fingerprints, newest last, and returns a :class:`FaultVerdict`.
The rules, strongest first (each one can be switched off, see :class:`FaultPolicy`):

1. **Bad checkpoint.** A non-finite loss right after a resume, or the same
   fault twice within ``suspect_checkpoint_steps`` steps of resuming from the
   same checkpoint: mark that checkpoint bad and restart (the integrations then
   resume from the newest older good one). Once per checkpoint. An in-memory
   snapshot resumed from is a checkpoint here too (``resumed_from`` names it:
   :mod:`ft_core.snapshots.condemned`).
2. **Deterministic fault.** The same fingerprint ``max_identical_faults`` times
   in a row (same kind, exception type and innermost user frames, same
   iteration, same culprit ranks unless every rank raised it alike; an exception,
   or a hang with the culprit's stack: a crash or a signal says nothing of where
   it happened, so it never counts) with no newer checkpoint in between: stop, with
   the do-not-requeue exit code and a headline naming the exception, the rank
   and the iteration.
3. **Bad node.** ``suspect_node_faults`` faults in a row whose culprit is on the
   same node, with different fingerprints: exclude the node when a spare waits,
   else restart and name the node in the headline.
4. Otherwise restart, as always.

Pure: the launcher gathers the fingerprints and carries the verdict out.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import sysconfig
import traceback
from collections.abc import Sequence
from types import TracebackType
from typing import Optional

__all__ = ["NONFINITE_LOSS_ERROR", "FaultAction", "FaultClass", "FaultOutcome", "FaultPolicy", "FaultVerdict", "Fingerprint", "NonFiniteLossError",
           "decide_fault", "exception_name", "innermost_user_frames", "user_frames"]

#: How many frames of user code a fingerprint keeps (innermost first): enough to tell two places apart.
FINGERPRINT_FRAMES = 3
_PACKAGES = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NOT_USER_CODE = tuple(os.path.realpath(p) + os.sep for p in {
    sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
    # ft_core and ft_integrations only: in a source checkout their parent also holds the user's scripts.
    os.path.join(_PACKAGES, "ft_core"), os.path.join(_PACKAGES, "ft_integrations"),
})


def exception_name(exc: BaseException) -> str:
    """``module.QualName`` of an exception's type (builtins without the module): ``ValueError``."""
    kind = type(exc)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def user_frames(tb: Optional[TracebackType], limit: int = FINGERPRINT_FRAMES) -> list[str]:
    """The innermost ``limit`` frames of a traceback in user code, innermost first: ``"train.py:42 step"``.

    Frames in the standard library, in installed packages and in this project are
    skipped (an exception raised inside torch is placed by the user's line that
    called it); when no frame is left, the innermost frames whatever their file.
    """
    return innermost_user_frames([(f.filename, f.lineno or 0, f.name) for f in traceback.extract_tb(tb)], limit)


def innermost_user_frames(frames: Sequence[tuple[str, int, str]], limit: int = FINGERPRINT_FRAMES) -> list[str]:
    """:func:`user_frames` of any call stack given outermost first as ``(file, line, function)``.

    The one rule of what is user code, for a traceback and for a hung rank's stack dump
    (:func:`ft_core.diagnosis.dumped_frames`) alike.
    """
    user = [f for f in frames if not os.path.realpath(f[0]).startswith(_NOT_USER_CODE)] or list(frames)
    return [f"{os.path.basename(file)}:{line} {name}" for file, line, name in reversed(user[-limit:])]


class NonFiniteLossError(RuntimeError):
    """The loss was NaN or infinite within the first steps after a resume: the checkpoint is suspect.

    The integrations raise it (the Lightning callback, the Megatron hooks); the rank's
    exception report carries its type, and the launcher fingerprints the fault as
    :attr:`FaultClass.NONFINITE_LOSS` (rule 1: the checkpoint resumed from is marked bad).
    """

    def __init__(self, loss: float, step: int, steps_after_resume: int, checkpoint: Optional[str] = None) -> None:
        self.loss, self.step, self.steps_after_resume, self.checkpoint = loss, step, steps_after_resume, checkpoint
        source = f" from {checkpoint}" if checkpoint else ""
        super().__init__(f"non-finite loss {loss} at step {step}, {steps_after_resume} step(s) after resuming{source}")


#: How a rank's exception report names :class:`NonFiniteLossError` (:func:`exception_name`).
NONFINITE_LOSS_ERROR = f"{NonFiniteLossError.__module__}.{NonFiniteLossError.__qualname__}"


class FaultClass(str, enum.Enum):
    """What ended a cycle, as far as the policy is concerned (a :class:`Fingerprint`'s ``kind``).

    Not :class:`ft_integrations.fault_injection.FaultKind`, the faults a test injects.
    """

    CRASH = "crash"  # a worker exited non-zero (no exception reported)
    EXCEPTION = "exception"  # a worker raised; the client reported the type and frames first
    SIGNAL = "signal"  # a worker died of a signal (SIGSEGV, SIGKILL by the OOM killer, ...)
    HANG = "hang"  # a deadline passed; the diagnosis names the culprit
    NONFINITE_LOSS = "nonfinite_loss"  # NaN or infinity in the loss right after a resume


class FaultAction(str, enum.Enum):
    """What the launcher does about the fault (its lifecycle: one verdict per faulty cycle)."""

    RESTART = "restart"
    MARK_CHECKPOINT_BAD = "mark_checkpoint_bad"  # then restart: the resume falls back to an older one
    EXCLUDE_NODE = "exclude_node"  # the culprit's node leaves; a waiting spare takes its place
    STOP = "stop"  # exit with the do-not-requeue code


class FaultOutcome(str, enum.Enum):
    """What the job did about a fault (a ``fault_decision``'s ``outcome``): the job-wide decision, seen by a node."""

    RESTART = "restart"
    STOP = "stop"
    LEAVE = "leave"  # this node was the excluded suspect: it left, the others restart


@dataclasses.dataclass(frozen=True)
class Fingerprint:
    """One cycle-ending fault, as recorded in its event.

    ``frames``: the innermost frames in user code (``file:line function``), for an
    exception the raising ones, for a hang the culprit's stack; ``resumed_from`` and
    ``resumed_step``: the checkpoint the cycle started from; ``new_checkpoint``: the
    cycle wrote a checkpoint newer than that before the fault. ``alike``: several ranks
    reported this same exception (type, frames, iteration) and none another: a fault of
    the job, not of a rank (a NaN check on every rank), so which rank died first
    (``culprits``) is chance and not part of the fault (:meth:`same_fault`).
    """

    kind: FaultClass
    culprits: tuple[int, ...] = ()
    nodes: tuple[str, ...] = ()
    iteration: Optional[int] = None
    exception_type: Optional[str] = None
    frames: tuple[str, ...] = ()
    signal: Optional[str] = None
    resumed_from: Optional[str] = None
    resumed_step: Optional[int] = None
    new_checkpoint: bool = False
    alike: bool = False

    @property
    def steps_after_resume(self) -> Optional[int]:
        if self.iteration is None or self.resumed_step is None:
            return None
        return self.iteration - self.resumed_step

    def same_fault(self, other: Fingerprint) -> bool:
        """Whether two faults are the same fault (deterministic): not the node, not the time.

        The culprit ranks count unless either fault was reported alike by several ranks: the
        first rank to die is then chance (rank 0 in one cycle, rank 1 in the next), and a
        cycle whose launcher saw only the first rank's report is still the same fault.
        """
        return ((self.kind, self.exception_type, self.frames, self.signal, self.iteration)
                == (other.kind, other.exception_type, other.frames, other.signal, other.iteration)
                and (self.alike or other.alike or self.culprits == other.culprits))

    def describe(self) -> str:
        """The fault in a few words: ``ValueError at train.py:42 in training_step on rank 1 at iteration 30``."""
        what = self.exception_type or (f"signal {self.signal}" if self.signal else self.kind.value)
        where = f" at {self.frames[0]}" if self.frames else ""
        ranks = f" on rank{'s' if len(self.culprits) > 1 else ''} {', '.join(map(str, self.culprits))}" \
            f"{' alike' if self.alike else ''}" if self.culprits else ""
        step = f" at iteration {self.iteration}" if self.iteration is not None else ""
        return f"{what}{where}{ranks}{step}"


@dataclasses.dataclass(frozen=True)
class FaultPolicy:
    """The rules' settings; 0 switches a rule off."""

    #: Stop after this many identical deterministic faults in a row (``--ft-max-identical-faults``).
    max_identical_faults: int = 2
    #: A fault this many steps or fewer after a resume, twice from the same checkpoint, marks it bad.
    suspect_checkpoint_steps: int = 10
    #: Faults in a row on one node, with different fingerprints, that make it a suspect.
    suspect_node_faults: int = 3


@dataclasses.dataclass(frozen=True)
class FaultVerdict:
    """The decision and why; ``checkpoint`` to mark bad, ``node`` to exclude or name."""

    action: FaultAction
    reason: str
    checkpoint: Optional[str] = None
    node: Optional[str] = None


def _bad_checkpoint(history: Sequence[Fingerprint], cfg: FaultPolicy, marked: frozenset[str]) -> Optional[FaultVerdict]:
    last = history[-1]
    if last.resumed_from is None or last.resumed_from in marked:
        return None
    if last.kind is FaultClass.NONFINITE_LOSS:
        return FaultVerdict(FaultAction.MARK_CHECKPOINT_BAD, f"non-finite loss {last.steps_after_resume} step(s) after "
                       f"resuming from {last.resumed_from}", checkpoint=last.resumed_from)
    if cfg.suspect_checkpoint_steps <= 0 or len(history) < 2:
        return None
    pair = history[-2:]
    early = all(f.steps_after_resume is not None and 0 <= f.steps_after_resume <= cfg.suspect_checkpoint_steps
                and not f.new_checkpoint for f in pair)
    if early and pair[0].resumed_from == last.resumed_from and pair[0].same_fault(last):
        return FaultVerdict(FaultAction.MARK_CHECKPOINT_BAD, f"{last.describe()}, twice within "
                       f"{cfg.suspect_checkpoint_steps} steps of resuming from {last.resumed_from}",
                       checkpoint=last.resumed_from)
    return None


def _deterministic(history: Sequence[Fingerprint], cfg: FaultPolicy) -> Optional[FaultVerdict]:
    count = cfg.max_identical_faults
    if count <= 0 or len(history) < count:
        return None
    recent = history[-count:]
    last = recent[-1]
    # Only a fault that says where it happened can be the same fault again: an exception (its type and
    # frames) or a hang with the culprit's stack, at a known iteration. A crash or a signal says neither:
    # the same rank killed twice is as likely two transient faults (the OOM killer, a node's hiccup).
    placed = last.kind is FaultClass.EXCEPTION or (last.kind is FaultClass.HANG and bool(last.frames))
    if not placed or last.iteration is None:
        return None
    same = all(f.same_fault(last) for f in recent)
    # A checkpoint written in between means the job moved on: the repeat may be a new, later fault.
    no_progress = not any(f.new_checkpoint for f in recent[1:])
    if same and no_progress:
        return FaultVerdict(FaultAction.STOP, f"{last.describe()}, {count} times in a row with no new checkpoint in "
                       "between: a deterministic fault, restarting cannot help")
    return None


def _bad_node(history: Sequence[Fingerprint], cfg: FaultPolicy, spare_waiting: bool,
              only_node: bool) -> Optional[FaultVerdict]:
    count = cfg.suspect_node_faults
    if count <= 0 or len(history) < count or only_node:  # one node: every fault is on it, that says nothing
        return None
    recent = history[-count:]
    nodes = [set(f.nodes) for f in recent]
    common = set.intersection(*nodes) if all(nodes) else set()
    if len(common) != 1 or all(f.same_fault(recent[-1]) for f in recent):
        return None  # not one node, or one fault repeating (rule 2's business)
    node = next(iter(common))
    reason = f"{count} different faults in a row on node {node}"
    if spare_waiting:
        return FaultVerdict(FaultAction.EXCLUDE_NODE, f"{reason}: excluding it, a spare takes its place", node=node)
    return FaultVerdict(FaultAction.RESTART, f"{reason} (no spare waits to replace it: check that node)", node=node)


def decide_fault(history: Sequence[Fingerprint], cfg: FaultPolicy = FaultPolicy(), *, spare_waiting: bool = False,
           marked_bad: frozenset[str] = frozenset(), only_node: bool = False) -> FaultVerdict:
    """The verdict on the newest fault of ``history`` (oldest first; at least one).

    ``marked_bad``: checkpoints already marked bad (rule 1 applies once per checkpoint);
    ``spare_waiting``: a hot spare could replace an excluded node; ``only_node``: the job runs on
    one node (rule 3 then never applies).
    """
    if not history:
        raise ValueError("decide_fault() needs the fault to decide on: history is empty")
    return (_bad_checkpoint(history, cfg, marked_bad) or _deterministic(history, cfg)
            or _bad_node(history, cfg, spare_waiting, only_node) or FaultVerdict(FaultAction.RESTART, "a fault restarting may fix"))
