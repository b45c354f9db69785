"""The rules of one watched rank: its open sections, its deadlines, and the CPU probe.

:class:`WatchedRank` is what the monitor knows about one connected rank and
when its next deadline falls (first heartbeat, next heartbeat, every open
tracked section, time out of any section); the server passes ``now`` in, so the
rules are testable without a clock and the server only acts on them.

A rank past its deadline that is runnable but not getting a CPU is starved, not
hung: :func:`cpu_probe` has it judged once it is asleep or blocked, or has run.

This module must not import torch: the monitor imports it.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Optional

from ft_core.config import FaultToleranceConfig
from ft_core.events import HangReason, RankEvidence
from ft_core.monitor.hang import Expiry, Hang
from ft_core.timeouts import COMPILE_SECTION, STEP_SECTION, HeartbeatTimeouts, SectionTimeouts
from ft_core.utils import procutil
from ft_core.utils.storage_io import StorageSample
from ft_core.warmup import WarmupRule, warmup_step_timeout

__all__ = ["CPU_PROBE", "IoWatch", "OpenSection", "WatchedRank", "cpu_probe"]

log = logging.getLogger("ft_core.monitor")

#: A runnable rank past its deadline is declared hung once it has had this much CPU time since
#: without a sign of life; until then it is waiting for a CPU, not hung (see ``cpu_probe``).
CPU_PROBE = 0.02


@dataclasses.dataclass
class OpenSection:
    """A tracked section a rank has open: since when, and how it is timed."""

    started: float
    #: A ``step`` in warm-up (WarmupRule): timed by :func:`~ft_core.timeouts.warmup_step_timeout`.
    warmup: bool = False


@dataclasses.dataclass
class IoWatch:
    """Slow storage at one deadline of a rank (see :mod:`.slow_storage`): what the monitor saw, how far it extended.

    Kept per rule (heartbeat, a section, out of section) for one run of its timer: a deadline whose
    timer restarted (a heartbeat came, the section was opened again) starts a new watch.
    """

    since: float  # when the watched deadline's timer started
    #: The regular files the rank's process tree had open at the monitor's last look: progress is measured from it.
    look: Optional[StorageSample] = None
    #: The deadline once extended for storage progress (see :meth:`.slow_storage.SlowStorage.extend`).
    extended_to: Optional[float] = None


@dataclasses.dataclass(frozen=True)
class _CpuProbe:
    """A rank past ``expiry`` but runnable: how much CPU it has had since (see :func:`cpu_probe`)."""

    expiry: Expiry
    started: float
    cpu_seconds: float  # the rank's CPU time when the probe started
    warned: bool = False


@dataclasses.dataclass
class WatchedRank:
    """What the monitor knows about one connected rank, and the rules for its deadlines.

    Times are ``time.monotonic()`` seconds; the server passes ``now`` in, so the
    rules are testable without a clock.
    """

    rank: int
    local_rank: int
    pid: int
    cfg: FaultToleranceConfig  # the monitor's config, completed by the rank's fallback values
    restart_count: int
    connected_at: float
    hb: HeartbeatTimeouts
    sections: SectionTimeouts
    dump_path: Optional[str]
    first_activity: Optional[float] = None
    last_activity: Optional[float] = None
    iteration: Optional[int] = None
    #: The first iteration the rank reported on this connection (= this cycle): where it resumed.
    first_iteration: Optional[int] = None
    open_sections: dict[str, OpenSection] = dataclasses.field(default_factory=dict)
    #: When the last tracked section closed; None while one is open and before the first one.
    out_of_section_since: Optional[float] = None
    #: Slow storage, per deadline rule (reason, section): see :meth:`io_watch`.
    io_watches: dict[tuple[HangReason, Optional[str]], IoWatch] = dataclasses.field(default_factory=dict)
    #: Set while the rank is past a deadline but runnable: judged once it has had some CPU.
    cpu_probe: Optional[_CpuProbe] = None
    #: Set once a deadline passed; the rank is never watched again.
    hang: Optional[Hang] = None
    #: ``step`` sections completed, their total and last duration (seconds): for the metrics endpoint.
    steps: int = 0
    step_seconds: float = 0.0
    last_step_seconds: Optional[float] = None
    #: Which timeout times each ``step`` during warm-up; one rule per connection (= per cycle).
    warmup: WarmupRule = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.warmup = WarmupRule(self.cfg.num_warmup_iterations, self.sections.section)

    def touch(self, now: float, iteration: Optional[int] = None) -> None:
        """Record a sign of life: heartbeats and every section event count alike."""
        self.last_activity = now
        if self.first_activity is None:
            self.first_activity = now
        if iteration is not None:
            self.iteration = iteration
            if self.first_iteration is None:
                self.first_iteration = iteration

    def section_start(self, name: str, now: float, iteration: Optional[int] = None) -> None:
        """Open ``name``; during warm-up a ``step`` is timed as :class:`~ft_core.timeouts.WarmupRule` says."""
        self.touch(now, iteration)
        timed_as = self.warmup.section_opened(name, iteration)
        self.open_sections[name] = OpenSection(now, warmup=name == STEP_SECTION and timed_as != STEP_SECTION)
        self.out_of_section_since = None

    def section_end(self, name: str, now: float) -> bool:
        """Close ``name``; False if it was not open. Out-of-section time starts when none is left open.

        Closing ``compile`` resumes the sections it paused: their clocks skip the compilation.
        """
        self.touch(now)
        section = self.open_sections.pop(name, None)
        self.io_watches.pop((HangReason.SECTION, name), None)
        was_open = section is not None
        if section is not None and name == COMPILE_SECTION:
            paused = now - section.started
            for other_name, other in self.open_sections.items():
                watch = self.io_watches.get((HangReason.SECTION, other_name))
                if watch is not None and watch.since == other.started:
                    watch.since += paused
                    if watch.extended_to is not None:
                        watch.extended_to += paused
                other.started += paused
        if section is not None and name == "step":
            self.steps += 1
            self.last_step_seconds = now - section.started
            self.step_seconds += self.last_step_seconds
        if not self.open_sections:
            self.out_of_section_since = now
        return was_open

    def end_all_sections(self, now: float) -> None:
        self.touch(now)
        self.open_sections.clear()
        self.out_of_section_since = now

    def evidence(self, now: float, wall_now: float) -> RankEvidence:
        """What this rank is doing at ``now`` (monotonic; ``wall_now`` is the same instant in unix time)."""
        last = self.last_activity
        expiry = self.next_deadline()
        return RankEvidence(
            rank=self.rank, pid=self.pid, iteration=self.iteration,
            section=next(reversed(self.open_sections), None),  # the innermost: opened last
            last_activity=None if last is None else round(wall_now - (now - last), 3),
            stalled_for=None if last is None else round(now - last, 3),
            stopped=self.pid > 0 and procutil.is_stopped(self.pid),
            timeout=None if expiry is None else expiry.timeout)

    def _warmup_timeout(self) -> Optional[float]:
        return warmup_step_timeout(self.sections, self.hb.initial, self.cfg.rank_section_timeouts.get(STEP_SECTION))

    def next_deadline(self) -> Optional[Expiry]:
        """The earliest deadline of this rank, or None when nothing is timed.

        While torch.compile compiles (``compile`` is open) only ``compile_timeout`` runs: a
        recompile is not a slow step, nor a missing heartbeat.
        """
        compiling = self.open_sections.get(COMPILE_SECTION)
        if compiling is not None:
            limit = self.cfg.compile_timeout
            return None if limit is None else Expiry(compiling.started + limit, HangReason.SECTION, COMPILE_SECTION,
                                                     limit, compiling.started)
        candidates = []
        if self.first_activity is None:
            if self.hb.initial is not None:
                candidates.append(Expiry(self.connected_at + self.hb.initial, HangReason.INITIAL_HEARTBEAT, None,
                                         self.hb.initial, self.connected_at))
        elif self.hb.subsequent is not None and self.last_activity is not None:
            candidates.append(Expiry(self.last_activity + self.hb.subsequent, HangReason.HEARTBEAT, None,
                                     self.hb.subsequent, self.last_activity))
        for name, section in self.open_sections.items():
            timeout = self._warmup_timeout() if section.warmup else self.sections.section.get(name)
            if timeout is not None:
                candidates.append(Expiry(section.started + timeout, HangReason.SECTION, name, timeout, section.started))
        # Out-of-section time runs only from the end of a section (None before the first
        # one): start-up is covered by the initial heartbeat timeout (NVRx does the same).
        since = self.out_of_section_since
        if not self.open_sections and since is not None and self.sections.out_of_section is not None:
            candidates.append(Expiry(since + self.sections.out_of_section, HangReason.OUT_OF_SECTION, None,
                                     self.sections.out_of_section, since))
        return min((self._extended(c) for c in candidates), key=lambda c: c.deadline) if candidates else None

    def io_watch(self, expiry: Expiry) -> IoWatch:
        """The slow-storage watch of ``expiry``'s rule, new when its timer restarted since the last one."""
        key = (expiry.reason, expiry.section)
        watch = self.io_watches.get(key)
        if watch is None or watch.since != expiry.since:
            watch = self.io_watches[key] = IoWatch(expiry.since)
        return watch

    def _extended(self, expiry: Expiry) -> Expiry:
        """``expiry`` at its deadline as extended for storage progress, if it was."""
        watch = self.io_watches.get((expiry.reason, expiry.section))
        if watch is None or watch.since != expiry.since or watch.extended_to is None:
            return expiry
        return dataclasses.replace(expiry, deadline=max(expiry.deadline, watch.extended_to))


def cpu_probe(rank: WatchedRank, expiry: Expiry, now: float) -> Optional[float]:
    """Seconds to wait before judging ``rank`` past ``expiry``, or None to judge it now.

    A rank that is runnable but not running -- waiting for a CPU on an
    overloaded node -- is starved, not hung. So a rank past its deadline is
    declared hung only once it is asleep or blocked (a hang in a collective,
    a lock, I/O), or has been on a CPU for :data:`CPU_PROBE` seconds since
    without a sign of life (a busy hang). A sleeping rank is judged at once.
    """
    sample = procutil.cpu_sample(rank.pid) if rank.pid > 0 else None
    if sample is None or not sample.runnable:
        return None
    probe = rank.cpu_probe
    if probe is None or probe.expiry != expiry:
        rank.cpu_probe = _CpuProbe(expiry, now, sample.cpu_seconds)
        return CPU_PROBE
    if sample.cpu_seconds - probe.cpu_seconds >= CPU_PROBE:
        return None  # it ran and said nothing
    if not probe.warned and now - probe.started >= 2 * CPU_PROBE:
        rank.cpu_probe = dataclasses.replace(probe, warned=True)
        log.warning("rank %d (pid %d) is past its %s deadline but waiting for a CPU (overloaded node?): "
                    "it is judged once it has run", rank.rank, rank.pid, expiry.reason.value)
    return CPU_PROBE
