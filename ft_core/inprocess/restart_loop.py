"""The restart loop run by one rank for one call of a wrapped function.

``torch.distributed`` is imported where it is used: the watchdog process
imports this package too, and must start (and enforce the hard timeout)
without waiting for a torch import.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import inspect
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from .blame import raised_in_torch_distributed
from .call_wrapper import CallWrapper
from .exceptions import RankShouldRestart, RestartAbort
from .hook_context import RankAssignmentCtx, State
from .interruption import Interruptor
from .progress_watchdog import MainThreadProgress, ProgressWatchdog
from .restart_records import RestartRecords
from .shared_state import RestartPhase, SharedState
from .watchdog_process import RankWatchdogProcess, WatchdogConfig
from .watchdog_thread import WatchdogThread

if TYPE_CHECKING:
    from .wrapper import Hook, Wrapper

__all__ = ["RestartLoop"]

log = logging.getLogger("ft_core.inprocess")

_EXPORTED_ENV = ("RANK", "WORLD_SIZE")


@dataclass
class _Outcome:
    done: bool = False
    result: Any = None
    faulted: bool = False  # the attempt's fault is blamed on this rank


class _AbortOnce:
    """Runs the abort hook once per attempt, from whichever thread gets there first."""

    def __init__(self, hook: Optional[Hook], state: State) -> None:
        self._hook = hook
        self._state = state
        self._lock = threading.Lock()
        self._done = False

    def __call__(self) -> None:
        with self._lock:  # a second caller waits until the abort finished
            if self._done or self._hook is None:
                return
            self._done = True
            try:
                self._hook(self._state)
            except Exception:
                log.exception("rank %d: abort hook failed", self._state.initial_rank)


def _read_identity() -> tuple[int, int]:
    import torch.distributed as dist

    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("ft_core.inprocess.Wrapper: call the wrapped function from the main thread")
    if dist.is_available() and dist.is_initialized():
        raise RuntimeError(
            "ft_core.inprocess.Wrapper: torch.distributed is already initialized; "
            "initialize it inside the wrapped function (store=call_wrapper.store)"
        )
    values = {}
    for name in ("RANK", "WORLD_SIZE"):
        raw = os.environ.get(name)
        try:
            values[name] = int(raw or "")
        except ValueError:
            raise RuntimeError(
                f"ft_core.inprocess.Wrapper: environment variable {name}={raw!r} is invalid; "
                "allowed: an int (start the job with torchrun, ft_launcher or set it)"
            ) from None
    rank, world_size = values["RANK"], values["WORLD_SIZE"]
    if not 0 <= rank < world_size:
        raise RuntimeError(f"ft_core.inprocess.Wrapper: RANK={rank} is not in 0..WORLD_SIZE-1 ({world_size})")
    return rank, world_size


def _restore_env(saved: dict[str, Optional[str]]) -> None:
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


class RestartLoop:
    """One rank's run of ``fn`` under ``options``: setup, attempts, teardown."""

    def __init__(self, options: Wrapper, fn: Callable[..., Any]) -> None:
        self.o = options
        self.fn = fn
        self.takes_call_wrapper = "call_wrapper" in inspect.signature(fn).parameters
        self.attempt = 0

    def run(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.rank, self.world_size = _read_identity()
        self.args, self.kwargs = args, kwargs
        with contextlib.ExitStack() as cleanup:
            saved_env = {name: os.environ.get(name) for name in _EXPORTED_ENV}
            cleanup.callback(_restore_env, saved_env)
            self.shared = SharedState.create()
            cleanup.callback(self.shared.close)
            self.progress = MainThreadProgress(self.shared)
            self.monitor = RankWatchdogProcess.start(self._monitor_config(), self.shared)
            cleanup.callback(self.monitor.stop, self.o.termination_grace_time)
            if self.o.progress_watchdog_interval is not None:
                watchdog = ProgressWatchdog(self.progress, self.o.progress_watchdog_interval).start()
                cleanup.callback(watchdog.stop)
            self.interruptor = Interruptor(self.o.interrupt_signal)
            self.interruptor.install()
            cleanup.callback(self.interruptor.uninstall)
            return self._run_with_store()

    def _monitor_config(self) -> WatchdogConfig:
        return WatchdogConfig(
            store_factory=self.o.store_factory,
            rank=self.rank,
            world_size=self.world_size,
            parent_pid=os.getpid(),
            interval=self.o.monitor_process_interval,
            heartbeat_timeout=self.o.heartbeat_timeout,
            hard_timeout=self.o.hard_timeout,
            termination_grace_time=self.o.termination_grace_time,
            log_level=log.getEffectiveLevel(),
        )

    def _run_with_store(self) -> Any:
        import torch.distributed as dist

        records: Optional[RestartRecords] = None
        try:
            raw = self.o.store_factory(host=self.rank == 0, timeout=self.o.barrier_timeout)
            records = RestartRecords(raw, self.world_size, self.o.monitor_thread_interval)
            # A second connection for the function, so its blocking store calls
            # (rendezvous of init_process_group) never delay the watchdog thread.
            self.user_store = self.o.store_factory(host=False, timeout=self.o.soft_timeout)
            result = self._loop(records)
        except RestartAbort as exc:
            self._give_up(records, exc)
            raise
        except dist.DistError as exc:
            abort = RestartAbort(f"in-process store failed: {exc}")
            self._give_up(records, abort)
            raise abort from exc
        self._leave(records)
        return result

    def _give_up(self, records: Optional[RestartRecords], exc: RestartAbort) -> None:
        import torch.distributed as dist

        log.error("rank %d: in-process restart gives up: %s", self.rank, exc)
        if records is None:
            return
        try:
            records.abort(str(exc))
            # Ranks still running this attempt must leave it to learn about the abort.
            records.report_restart(self.attempt, None, f"in-process restart aborted: {exc}")
            self._leave(records)
        except dist.DistError as store_exc:
            log.debug("rank %d: could not record the abort: %s", self.rank, store_exc)

    def _leave(self, records: RestartRecords) -> None:
        """Final barrier: rank 0 may serve the store, so it leaves last."""
        self.monitor.stop(self.o.termination_grace_time)  # before leaving, so it reports nothing
        records.leave(self.rank)
        if self.rank == 0:
            missing = records.wait_left(self.o.barrier_timeout)
            if missing:
                log.warning("rank 0: ranks %s did not leave within %s s", sorted(missing), self.o.barrier_timeout)

    # -- attempts ---------------------------------------------------------------------------

    def _loop(self, records: RestartRecords) -> Any:
        previous: dict[int, int] = {}
        faults = 0
        healthy = True
        self.monitor.wait_ready(self.shared, self.o.barrier_timeout)
        while True:
            self.shared.enter(self.attempt, RestartPhase.BARRIER)
            members = records.join(self.attempt, self.rank, self.o.barrier_timeout)
            if self.rank not in members:
                raise RestartAbort(f"rank {self.rank} was recorded as terminated by its peers")
            ctx = self._assign(members, records.excluded(), previous)
            records.publish_active(self.attempt, ctx.active)
            self.shared.enter(self.attempt, RestartPhase.MEMBER)
            state = State(self.attempt, self.rank, self.world_size, ctx.ranks.get(self.rank), len(ctx.active), faults)
            if state.active:
                os.environ["RANK"], os.environ["WORLD_SIZE"] = str(state.rank), str(state.world_size)
            if state.active:
                log.info("rank %d: attempt %d, running as rank %d of %d", self.rank, self.attempt,
                         state.rank, state.world_size)
            else:
                log.info("rank %d: attempt %d, inactive (%d ranks run the function)", self.rank,
                         self.attempt, state.world_size)
            outcome = self._run_iteration(records, state)
            if outcome.done:
                return outcome.result
            faults += outcome.faulted
            if healthy and not self._recover(dataclasses.replace(state, fault_count=faults)):
                healthy = False
                records.mark_excluded(self.rank)
            previous = dict(ctx.ranks)
            self.attempt += 1

    def _assign(self, members: tuple[int, ...], excluded: set[int], previous: dict[int, int]) -> RankAssignmentCtx:
        healthy = tuple(m for m in members if m not in excluded)
        ctx = RankAssignmentCtx(self.attempt, healthy, healthy, previous)
        if self.o.rank_filter is not None:
            ctx = self.o.rank_filter(ctx)
        ctx = self.o.rank_assignment(ctx)
        if not ctx.active:
            raise RestartAbort(f"attempt {self.attempt}: no healthy rank left to run the function")
        if not (
            set(ctx.active) <= set(healthy)
            and set(ctx.ranks) == set(ctx.active)
            and sorted(ctx.ranks.values()) == list(range(len(ctx.active)))
        ):
            raise RestartAbort(
                f"attempt {self.attempt}: invalid rank assignment {dict(ctx.ranks)} for active ranks "
                f"{ctx.active} (members {healthy}); ranks must be 0..{len(ctx.active) - 1}"
            )
        return ctx

    def _run_iteration(self, records: RestartRecords, state: State) -> _Outcome:
        if self.o.initialize is not None:
            try:
                self.o.initialize(state)
            except RestartAbort:
                raise
            except Exception as exc:
                log.exception("rank %d: initialize failed", self.rank)
                decision = records.report_restart(self.attempt, self.rank, f"initialize failed: {exc!r}")
                return _Outcome(faulted=decision.rank == self.rank)
        if not state.active:
            return _Outcome(done=records.wait_decision(self.attempt).done)
        return self._run_active(records, state)

    def _run_active(self, records: RestartRecords, state: State) -> _Outcome:
        import torch.distributed as dist

        abort = _AbortOnce(self.o.abort, state)
        user_store = dist.PrefixStore(f"it/{self.attempt}/user", self.user_store)
        call_wrapper = CallWrapper(state, user_store, self.progress, self.interruptor)
        kwargs = dict(self.kwargs, call_wrapper=call_wrapper) if self.takes_call_wrapper else self.kwargs
        monitor = WatchdogThread(
            records=records, attempt=self.attempt, rank=self.rank, progress=self.progress,
            interruptor=self.interruptor, abort=abort, soft_timeout=self.o.soft_timeout,
            hard_timeout=self.o.hard_timeout, interval=self.o.monitor_thread_interval,
        )
        self.interruptor.reset()
        self.progress.stamp()
        self.shared.armed = True  # from here the watchdog process enforces the hard timeout
        monitor.start()
        completed, value = self.interruptor.call(self.fn, *self.args, **kwargs)
        faulted = False
        if completed:
            monitor.stop()
            self.shared.armed = False
            records.complete(self.attempt, state.world_size)
            if records.wait_decision(self.attempt).done:
                return _Outcome(done=True, result=value)
        elif not isinstance(value, RankShouldRestart):
            faulted = self._report_failure(records, value, monitor, abort)
        # Drop the exception now: its traceback pins the function's frames and
        # with them the process group, whose open connections peers may be
        # blocked on (gloo only notices a peer's abort when its sockets close).
        value = None
        monitor.stop()
        abort()
        gc.collect()  # the same for frames caught in reference cycles
        self.shared.armed = False
        records.record_interrupted(self.attempt, self.rank)
        return _Outcome(faulted=faulted or monitor.blamed)

    def _report_failure(
        self, records: RestartRecords, exc: BaseException, monitor: WatchdogThread, abort: _AbortOnce
    ) -> bool:
        """Ask for a restart because the function raised ``exc``; True if the fault is this rank's."""
        reason = f"{type(exc).__name__}: {exc}"[:300]
        if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: this process leaves
            records.mark_terminated(self.rank)
            records.report_restart(self.attempt, self.rank, f"rank {self.rank} exits ({reason})")
            monitor.stop()
            abort()
            raise exc
        decision = None
        if raised_in_torch_distributed(exc):
            # Probably a peer's fault broke the collective: let that peer (or
            # the watchdog process that saw it die) report first.
            decision = records.decision_within(self.attempt, 2 * self.o.monitor_process_interval)
        if decision is None:
            decision = records.report_restart(self.attempt, self.rank, reason)
        if decision.rank == self.rank:
            log.error("rank %d: attempt %d failed; restarting all ranks", self.rank, self.attempt, exc_info=exc)
            return True
        # Name the decision (who failed and why), not only what this rank saw of it.
        log.info("rank %d: attempt %d restarts (rank %s: %s); here it ended with %s", self.rank,
                 self.attempt, decision.rank, decision.reason, reason)
        return False

    def _recover(self, state: State) -> bool:
        """Run ``finalize`` and ``health_check``; False if the rank must not run the function again."""
        for name in ("finalize", "health_check"):
            hook = getattr(self.o, name)
            if hook is None:
                continue
            try:
                hook(state)
            except Exception as exc:
                log.error("rank %d: %s failed (%s); excluded from further attempts", self.rank, name, exc)
                return False
        return True
