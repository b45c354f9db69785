"""The launcher's Prometheus endpoint (``--ft-metrics-port``): a live view of the job's fault tolerance.

Everything exported is derived from two sources, at scrape time:

* the launcher's own event stream: :class:`LauncherMetrics` observes every
  record the launcher writes to its event log (cycles, restarts, faults,
  monitor lateness, stragglers) and every straggler report it reads;
* the node monitor's status file (:mod:`ft_core.monitor.status`): per-rank
  last sign of life and ``step`` durations.

So the endpoint adds no work to the monitoring loop beyond a few counter
updates, and a scrape never waits for the loop. Names follow Prometheus
conventions (``ft_`` prefix, ``_total`` counters, ``_seconds`` units); every
series carries ``run_id`` (the job: ``$SLURM_JOB_ID`` under SLURM, kept across
requeues, else the rendezvous id) and ``node`` (the launcher's host, without
its pid, so a requeue or a restarted launcher continues the same series), and
per-rank series ``rank``. ``docs/events.md`` ("Metrics") describes each one.

Needs the ``metrics`` extra (``prometheus-client``).
"""

from __future__ import annotations

import collections
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Optional

from ft_core.events import (
    CycleStart,
    Diagnosis,
    Event,
    HangDetected,
    MonitorLate,
    Restart,
    RestartKind,
    Straggler,
    WorkerExit,
    WorkersStopped,
)
from ft_core.exit_causes import ExitCause
from ft_core.monitor.status import read_status
from ft_core.utils.fileutil import atomic_write_text
from ft_core.version import python_version, torch_version, version

if TYPE_CHECKING:
    from ft_core.launcher.observability.event_log import EventLog
    from ft_core.launcher.straggler_exchange import StragglerRound

__all__ = ["SCRAPE_TARGETS_DIR", "LauncherMetrics", "MetricsUnavailableError"]

log = logging.getLogger("ft_core.launcher")

#: Faults named by a record that says which rank was at fault; the others are counted from the restart.
_FAULTS_WITH_RANK = frozenset({RestartKind.HANG, RestartKind.CRASH})


#: Default directory of the Prometheus ``file_sd`` target files, beside the event log.
SCRAPE_TARGETS_DIR = "ft_metrics_targets"

#: The labels of every series, in this order: the job and the node (:attr:`LauncherMetrics.base`).
BASE_LABELS = ("run_id", "node")


def _single(family: Any, base: list[str], value: float) -> Any:
    """``family`` with its one sample, for this node."""
    family.add_metric(base, value)
    return family


class MetricsUnavailableError(RuntimeError):
    """``--ft-metrics-port`` was given but prometheus-client is not installed."""


class LauncherMetrics:
    """What the endpoint exports, kept up to date by :meth:`observe` and :meth:`observe_round`.

    Args:
        events: the launcher's event log (time lost and run time for the fault-free ratio).
        status_path: the node monitor's status file.
        run_id: the ``run_id`` label: the job's id across requeues (:func:`ft_core.launcher.rendezvous.slurm.job_id`).
    """

    def __init__(self, events: EventLog, status_path: str, run_id: str) -> None:
        self._events = events
        self._status_path = status_path
        #: The values of :data:`BASE_LABELS`: the launcher's host without its pid (``events.node`` is ``host:pid``).
        self.base = [run_id, events.node.rsplit(":", 1)[0]]
        self._lock = threading.Lock()
        self._restarts: collections.Counter[str] = collections.Counter()
        self._faults: collections.Counter[tuple[str, str]] = collections.Counter()
        self._stragglers: collections.Counter[tuple[str, str]] = collections.Counter()
        self._cycle: Optional[int] = None
        self._cycle_started: Optional[float] = None
        self._local_ranks: frozenset[int] = frozenset()
        #: This cycle's ranks that missed a deadline, until a diagnosis names the culprits among them.
        self._hung: set[int] = set()
        self._late_count = 0
        self._late_seconds = 0.0
        self._lost = 0.0
        self._scores: dict[tuple[int, str], tuple[float, float]] = {}
        self._server: Any = None
        self._target_file: Optional[str] = None

    # -- inputs ---------------------------------------------------------------
    def observe(self, record: Event) -> None:
        """Account one record the launcher wrote (called by its :class:`~ft_core.launcher.observability.event_log.EventLog`)."""
        with self._lock:
            match record:
                case CycleStart():
                    self._cycle, self._cycle_started = record.cycle, record.time
                    self._local_ranks = frozenset(int(rank) for rank in record.workers)
                    self._scores.clear()
                    self._hung.clear()
                case Restart():
                    self._restarts[record.kind.value] += 1
                    if record.kind is RestartKind.HANG:  # not diagnosed: every rank that expired counts
                        for rank in sorted(self._hung):
                            self._faults[(RestartKind.HANG.value, str(rank))] += 1
                    self._hung.clear()
                    self._cycle_started = None
                    if record.kind.is_fault and record.kind not in _FAULTS_WITH_RANK:
                        self._faults[(record.kind.value, "")] += 1
                case WorkersStopped():
                    self._cycle_started = None
                case HangDetected():
                    self._hung.add(record.rank)
                case Diagnosis():
                    # The culprits, not every rank that expired: the waiters were victims. Each node counts
                    # its own culprits, so a job-wide sum counts each once.
                    for rank in record.culprits:
                        if rank in self._local_ranks:
                            self._faults[(RestartKind.HANG.value, str(rank))] += 1
                    self._hung.clear()
                case WorkerExit() if record.cause is ExitCause.CRASH:
                    self._faults[(RestartKind.CRASH.value, "" if record.rank is None else str(record.rank))] += 1
                case Straggler():  # slow, not broken: not a fault (ft_restarts_total counts its restart)
                    self._stragglers[(str(record.rank), record.phase)] += 1
                case MonitorLate():
                    self._late_count += 1
                    self._late_seconds += record.late

    def observe_round(self, report: StragglerRound) -> None:
        """Keep the latest straggler scores of this node's ranks."""
        with self._lock:
            for score in report.scores:
                if score.rank in self._local_ranks:
                    self._scores[(score.rank, score.phase)] = (score.relative, score.individual)

    def _time_lost(self) -> float:
        """The event log's time lost to faults (:meth:`EventLog.time_lost`), never less than a value exported
        before: it is a counter, and a snapshot resume recorded after a restart shortens that fault's
        recomputation."""
        try:
            self._lost = max(self._lost, self._events.time_lost())
        except (OSError, ValueError, KeyError, TypeError) as exc:  # a scrape must answer: the last value then
            log.debug("time lost not computed: %s: %s", type(exc).__name__, exc)
        return self._lost

    # -- the endpoint -----------------------------------------------------------
    def start(self, port: int, targets_dir: Optional[str] = None, addr: str = "0.0.0.0") -> int:
        """Serve ``/metrics`` on ``port`` (0: a free port); returns the port and logs the address.

        With ``targets_dir``, also write this endpoint as a Prometheus ``file_sd`` target
        file there (see :meth:`_write_target`), removed by :meth:`stop`.
        """
        try:
            from prometheus_client import CollectorRegistry, start_http_server
        except ImportError:
            raise MetricsUnavailableError(
                "--ft-metrics-port needs prometheus-client: pip install 'ft-suite-pytorch[metrics]'") from None
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)  # a Collector is anything with collect()
        self._server, _thread = start_http_server(port, addr=addr, registry=registry)
        bound = int(self._server.server_address[1])
        log.info("metrics endpoint: http://%s:%d/metrics", addr, bound)
        if targets_dir is not None:
            self._write_target(targets_dir, bound)
        return bound

    def _write_target(self, directory: str, port: int) -> None:
        """``<directory>/<host>-<pid>.json``: ``[{"targets": ["<host>:<port>"], "labels": {}}]``.

        Prometheus's ``file_sd_configs`` reads every such file of a glob, so a port picked at
        random (``--ft-metrics-port=0``) is scraped without configuration. The file holds an
        address and no secret: mode 0644, so a Prometheus running as another user can read it.
        The series carry ``run_id`` and ``node`` themselves, so the target adds no labels.
        """
        host = socket.gethostname()
        path = os.path.join(directory, f"{host}-{os.getpid()}.json")
        try:
            atomic_write_text(path, json.dumps([{"targets": [f"{host}:{port}"], "labels": {}}]) + "\n")
            os.chmod(path, 0o644)
        except OSError as exc:  # the endpoint itself works: scraping it by hand still does
            log.warning("could not write the Prometheus target file %s: %s", path, exc)
            return
        self._target_file = path
        log.info("Prometheus file_sd target: %s", path)

    def stop(self) -> None:
        if self._target_file is not None:
            try:
                os.unlink(self._target_file)
            except FileNotFoundError:
                pass
            self._target_file = None
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def collect(self) -> Iterator[Any]:
        """The metric families, computed now (prometheus-client's Collector protocol)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily

        now = time.time()
        base = self.base
        build = GaugeMetricFamily("ft_build_info", "Always 1: the ft-suite-pytorch, torch and Python versions of this launcher",
                                  labels=[*BASE_LABELS, "version", "torch", "python"])
        build.add_metric([*base, version(), torch_version(), python_version()], 1)
        yield build
        lost = self._time_lost()
        with self._lock:
            restarts = CounterMetricFamily("ft_restarts", "Cycles ended by a restart, by kind", labels=[*BASE_LABELS, "kind"])
            for kind, count in sorted(self._restarts.items()):
                restarts.add_metric([*base, kind], count)
            yield restarts
            faults = CounterMetricFamily("ft_faults", "Faults seen by this node, by kind and culprit rank ('' when "
                                         "no rank is to blame)", labels=[*BASE_LABELS, "kind", "rank"])
            for (kind, rank), count in sorted(self._faults.items()):
                faults.add_metric([*base, kind, rank], count)
            yield faults
            stragglers = CounterMetricFamily("ft_stragglers", "Stragglers reported, by rank and phase",
                                             labels=[*BASE_LABELS, "rank", "phase"])
            for (rank, phase), count in sorted(self._stragglers.items()):
                stragglers.add_metric([*base, rank, phase], count)
            yield stragglers
            if self._cycle is not None:
                yield _single(GaugeMetricFamily("ft_cycle", "Current restart cycle (TORCHELASTIC_RESTART_COUNT)",
                                        labels=list(BASE_LABELS)), base, self._cycle)
            uptime = now - self._cycle_started if self._cycle_started is not None else 0.0
            yield _single(GaugeMetricFamily("ft_cycle_uptime_seconds", "Seconds since this node's workers of the current "
                                    "cycle started (0 between cycles)", labels=list(BASE_LABELS)), base, uptime)
            run_time = max(now - self._events.started, 1e-9)
            yield _single(CounterMetricFamily("ft_time_lost_seconds", "Seconds lost to faults: detection, restart and "
                                              "recomputation (as the exit summary and ft_launcher report)",
                                      labels=list(BASE_LABELS)), base, lost)
            yield _single(GaugeMetricFamily("ft_fault_free_time_ratio", "1 - ft_time_lost_seconds / launcher run time "
                                    "(not the report's goodput, which also discounts start-up)",
                                    labels=list(BASE_LABELS)), base, max(0.0, 1.0 - lost / run_time))
            yield _single(CounterMetricFamily("ft_monitor_late", "Late wake-ups of the node monitor (granted to the ranks as "
                                      "grace)", labels=list(BASE_LABELS)), base, self._late_count)
            yield _single(CounterMetricFamily("ft_monitor_late_seconds", "Total lateness of the node monitor's loop",
                                      labels=list(BASE_LABELS)), base, self._late_seconds)
            scores = GaugeMetricFamily("ft_straggler_score", "Latest straggler score of each local rank and phase "
                                       "(1.0 typical, lower is slower)", labels=[*BASE_LABELS, "rank", "phase", "kind"])
            for (scored, phase), (relative, individual) in sorted(self._scores.items()):
                scores.add_metric([*base, str(scored), phase, "relative"], relative)
                scores.add_metric([*base, str(scored), phase, "individual"], individual)
            yield scores
        status = read_status(self._status_path)
        ages = GaugeMetricFamily("ft_rank_heartbeat_age_seconds", "Seconds since each connected rank's last "
                                 "heartbeat or section event", labels=[*BASE_LABELS, "rank"])
        steps = SummaryMetricFamily("ft_rank_step_duration_seconds", "Durations of each rank's 'step' sections",
                                    labels=[*BASE_LABELS, "rank"])
        last_step = GaugeMetricFamily("ft_rank_last_step_duration_seconds", "Duration of each rank's last 'step' "
                                      "section", labels=[*BASE_LABELS, "rank"])
        for watched in sorted(status.ranks if status is not None else [], key=lambda r: r.rank):
            labels = [*base, str(watched.rank)]
            if watched.last_activity is not None:
                ages.add_metric(labels, max(0.0, now - watched.last_activity))
            steps.add_metric(labels, count_value=watched.steps, sum_value=watched.step_seconds)
            if watched.last_step_seconds is not None:
                last_step.add_metric(labels, watched.last_step_seconds)
        yield ages
        yield steps
        yield last_step
