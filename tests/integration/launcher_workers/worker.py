"""A tiny distributed training worker for ft_launcher tests, with fault injection.

Each step all-reduces one number over gloo and sends a heartbeat. Faults are
chosen by environment variables and happen only in the selected cycles
(``TORCHELASTIC_RESTART_COUNT``) on the selected global rank:

FT_TEST_FAULT         exception | exit3 | sigkill | sigsegv | hang | exclude | shutdown | shutdown_exit
                      | forever | none
                      | early_exit (exit 5 at start, before importing torch: the fastest possible cycle)
                      | abort_at_exit (SIGABRT after the last step, the finished flag and the clean shutdown,
                      as a C++ destructor's "terminate called without an active exception" does);
                      a comma-separated list gives one kind per cycle (cycle 0 first, "none" after the list)
FT_TEST_FAULT_CYCLES  for a single kind: "0,2" | "all" | "<50" (cycles below 50); default "0"
FT_TEST_FAULT_RANK    global rank that faults (default 0); "local0" = local rank 0 of every node
                      ("forever" applies to every rank: all step until they are stopped)
FT_TEST_FAULT_STEP    step at which the fault happens (default 1)
FT_TEST_FAULT_STEP_BY_CYCLE  comma-separated: the fault's step in cycle 0, 1, ... (overrides FT_TEST_FAULT_STEP)
FT_TEST_FAULT_AFTER   path: the fault waits until this file exists; cycles that start before it
                      exists step until they are stopped
FT_TEST_PEER_LOSS     "exit3": a rank whose all-reduce fails (a peer died) exits with code 3 at once, without an
                      exception report (as NCCL's watchdog aborts a rank whose peer is gone); default: the
                      error propagates and the client's exception hook reports it
FT_TEST_FAULT_AFTER_CYCLE  FT_TEST_FAULT_AFTER applies from this cycle on (default 0); earlier faults fire at once
FT_TEST_STEPS         steps per cycle (default 5); "forever" runs until signalled
FT_TEST_FINISH_AFTER  path: after its last step, its client's shutdown and the process group's end, the worker
                      records "finish_waiting" and waits until this file exists before it finishes and exits
FT_TEST_STEP_TIME     seconds slept per step (default 0.05)
FT_TEST_SECTIONS      "1": each step is a tracked section "step", with its iteration reported
                      (the fault then happens inside the step, before its all-reduce)
FT_TEST_LAGGARD_RANK  global rank that is slow but healthy in every cycle: it sleeps FT_TEST_LAGGARD_TIME more
                      per step, before its all-reduce
FT_TEST_LAGGARD_TIME  seconds the laggard adds to each step (default 1.0)
FT_TEST_FORWARD_TIME  seconds each step spends in a "forward" phase marked with client.timed() (straggler
                      detection); default: no phase is marked
FT_TEST_SLOW_RANK     global rank whose forward phase lasts FT_TEST_SLOW_FACTOR (default 1.6) times longer, in
                      the cycles FT_TEST_FAULT_CYCLES selects
FT_TEST_CHECKPOINT    report this checkpointed iteration at step 0 (default: none)
FT_TEST_ON_SIGTERM    "exit0" (exit 0 on SIGTERM) | "ignore" | "save" (a preemption save: write
                      FT_TEST_SAVE_FILE.rank<N> over FT_TEST_SAVE_TIME seconds, default 20, then exit 0);
                      default: Python's default
FT_TEST_FALLBACK      JSON object: the fallback_config this worker offers the monitor
FT_TEST_MARK_FINISHED "1": every rank creates the finished flag (FAULT_TOL_FINISHED_FLAG_FILE) after its last step
FT_TEST_REPORT_FINISHED "all" | a global rank: the ranks whose client shutdown reports training complete
                      (shutdown_workload_monitoring(training_finished=True)); default: none
FT_TEST_CHILD         "1": every worker starts a child process that ignores SIGTERM and sleeps (a data loader
                      worker blocked in I/O), in the worker's process group; each worker records the children of
                      earlier cycles still alive when it starts ("earlier_children_alive")
FT_TEST_RECORD        JSON-lines file: pid, rank, cycle and timestamps of each worker, and the config
                      the monitor sent it ("monitor_config")
FT_TEST_RESUME_FILE   a "checkpoint": global rank 0 writes the number of steps done so far (all cycles);
                      every cycle resumes from it (recorded as "resumed") and runs FT_TEST_STEPS more
FT_TEST_TORCH         "0": never import torch (no process group, no all-reduce; only RankMonitorClient),
                      so many nodes fit on a few cores. Nothing holds the healthy ranks back then, so in a
                      cycle where some rank faults, the others step until they are stopped (as they
                      would block in the all-reduce)
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

STARTED = time.time()
RANK = int(os.environ["RANK"])
LOCAL_RANK = int(os.environ["LOCAL_RANK"])
CYCLE = int(os.environ["TORCHELASTIC_RESTART_COUNT"])


def record(**fields) -> None:
    path = os.environ.get("FT_TEST_RECORD")
    if path:
        line = json.dumps({"pid": os.getpid(), "rank": RANK, "cycle": CYCLE, **fields}) + "\n"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())  # one write: lines of concurrent workers never interleave
        finally:
            os.close(fd)


def save_on_sigterm(*_) -> None:
    """A slow preemption save: one chunk every 0.1 s, "complete" last, then the file is put in place."""
    path = f"{os.environ['FT_TEST_SAVE_FILE']}.rank{RANK}"
    record(event="save_started", time=time.time())
    chunks = int(float(os.environ.get("FT_TEST_SAVE_TIME", "20")) * 10)
    with open(path + ".tmp", "w") as handle:
        for chunk in range(chunks):
            handle.write(f"chunk {chunk}\n")
            handle.flush()
            time.sleep(0.1)
        handle.write("complete\n")
    os.replace(path + ".tmp", path)
    record(event="saved", time=time.time())
    os._exit(0)


def cycle_fault() -> str:
    """The fault some rank injects in this cycle, or "none"."""
    kinds = os.environ.get("FT_TEST_FAULT", "none").split(",")
    if len(kinds) > 1:
        return kinds[CYCLE] if CYCLE < len(kinds) else "none"
    return kinds[0] if cycle_selected() else "none"


def fault_kind() -> str:
    """The fault this worker injects in this cycle, or "none"."""
    kind = cycle_fault()
    who = os.environ.get("FT_TEST_FAULT_RANK", "0")
    selected = LOCAL_RANK == 0 if who == "local0" else RANK == int(who)
    return kind if selected or kind == "forever" else "none"


def read_resume_step(path) -> int:
    try:
        with open(path) as handle:
            return int(handle.read())
    except FileNotFoundError:
        return 0


def write_resume_step(path, step: int) -> None:
    with open(path + ".tmp", "w") as handle:
        handle.write(str(step))
    os.replace(path + ".tmp", path)  # a reader never sees a half-written checkpoint


def cycle_selected() -> bool:
    cycles = os.environ.get("FT_TEST_FAULT_CYCLES", "0")
    if cycles != "all":
        if cycles.startswith("<"):
            if CYCLE >= int(cycles[1:]):
                return False
        elif CYCLE not in {int(c) for c in cycles.split(",")}:
            return False
    return True


def inject(kind: str, client) -> None:
    from ft_core.client import WorkloadAction, WorkloadControlRequest

    record(event="fault", kind=kind, time=time.time())
    if kind == "exception":
        raise RuntimeError("injected failure")
    if kind == "exit3":
        os._exit(3)
    if kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "sigsegv":
        import ctypes

        ctypes.string_at(0)  # a real segmentation fault
    if kind in ("exclude", "shutdown", "shutdown_exit"):
        action = WorkloadAction.ExcludeThisNode if kind == "exclude" else WorkloadAction.ShutdownWorkload
        client.send_workload_control_request(WorkloadControlRequest(action, f"test {kind}"))
        if kind == "shutdown_exit":
            os._exit(1)  # as an exception policy does: ask for the shutdown, then let the rank die
    # hang, exclude, shutdown: stop heartbeating and wait to be stopped
    while True:
        time.sleep(3600)


def start_child() -> None:
    import subprocess

    from ft_core.event_file import read_events

    def pid_alive(pid: int) -> bool:  # exists and is not a zombie
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                return handle.read().rpartition(b")")[2].split()[0] != b"Z"
        except OSError:
            return False

    earlier = [r["child"] for r in read_events(os.environ["FT_TEST_RECORD"])[0]
               if r.get("event") == "child" and r["cycle"] < CYCLE]
    record(event="earlier_children_alive", pids=[pid for pid in earlier if pid_alive(pid)])
    child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                              "signal.SIG_IGN); time.sleep(3600)"])
    record(event="child", child=child.pid)


class NoMonitor:
    """Stands in for RankMonitorClient when the worker runs without ft_launcher."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def main() -> int:
    on_sigterm = os.environ.get("FT_TEST_ON_SIGTERM")
    if on_sigterm == "exit0":
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    elif on_sigterm == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif on_sigterm == "save":
        signal.signal(signal.SIGTERM, save_on_sigterm)
    record(event="started", time=STARTED, prewarmed="ft_core.launcher.startup.zygote" in sys.modules,
           dynamo="torch._dynamo" in sys.modules)
    if os.environ.get("FT_TEST_CHILD") == "1":
        start_child()
    kind = fault_kind()
    if kind == "early_exit":
        os._exit(5)

    use_torch = os.environ.get("FT_TEST_TORCH", "1") != "0"
    if use_torch:
        import torch
        import torch.distributed as dist

    from ft_core.client import RankMonitorClient

    imported = time.time()
    if use_torch:
        dist.init_process_group("gloo")
    # Under plain torchrun (the benchmark's baseline) there is no monitor to talk to.
    monitored = bool(os.environ.get("FT_RANK_MONITOR_IPC_SOCKET"))
    client = RankMonitorClient() if monitored else NoMonitor()
    fallback = os.environ.get("FT_TEST_FALLBACK")
    client.init_workload_monitoring(fallback_config=json.loads(fallback) if fallback else None)
    if monitored:
        record(event="monitor_config", config=client.cfg.to_dict())
    client.send_heartbeat()
    record(event="first_heartbeat", time=time.time(), imported=imported)

    by_cycle = os.environ.get("FT_TEST_FAULT_STEP_BY_CYCLE", "").split(",")
    fault_step = int(by_cycle[CYCLE] if CYCLE < len(by_cycle) and by_cycle[CYCLE]
                     else os.environ.get("FT_TEST_FAULT_STEP", "1"))
    trigger_file = os.environ.get("FT_TEST_FAULT_AFTER")
    if CYCLE < int(os.environ.get("FT_TEST_FAULT_AFTER_CYCLE", "0")):
        trigger_file = None
    # Cycles that start before the trigger file exists step until they are stopped.
    waiting = trigger_file is not None and not os.path.exists(trigger_file)
    peers_fault = not use_torch and cycle_fault() not in ("none", "forever")
    steps = "forever" if kind == "forever" or waiting or peers_fault else os.environ.get("FT_TEST_STEPS", "5")
    step_time = float(os.environ.get("FT_TEST_STEP_TIME", "0.05"))
    checkpoint = os.environ.get("FT_TEST_CHECKPOINT")
    resume_file = os.environ.get("FT_TEST_RESUME_FILE")
    resumed = read_resume_step(resume_file) if resume_file else 0
    if resume_file:
        record(event="resumed", step=resumed, time=time.time())
    sections = os.environ.get("FT_TEST_SECTIONS") == "1"
    slow = os.environ.get("FT_TEST_LAGGARD_RANK") == str(RANK)
    slow_time = float(os.environ.get("FT_TEST_LAGGARD_TIME", "1.0"))
    forward = os.environ.get("FT_TEST_FORWARD_TIME")
    forward_time = float(forward) if forward else None
    if forward_time is not None and os.environ.get("FT_TEST_SLOW_RANK") == str(RANK) and cycle_selected():
        forward_time *= float(os.environ.get("FT_TEST_SLOW_FACTOR", "1.6"))
    step = 0
    while steps == "forever" or step < int(steps):
        if sections:
            client.set_iteration(step)
            client.start_section("step")
        if forward_time is not None:
            if step == 0:
                record(event="first_phase", time=time.time())
            with client.timed("forward"):
                time.sleep(forward_time)
        if step == 0 and checkpoint is not None:
            client.report_checkpoint(int(checkpoint))
        if step >= fault_step and kind not in ("none", "forever", "abort_at_exit"):
            if not trigger_file or os.path.exists(trigger_file):
                inject(kind, client)
        if slow:
            time.sleep(slow_time)
        if use_torch:
            value = torch.ones(1)
            try:
                dist.all_reduce(value)
            except Exception:
                if os.environ.get("FT_TEST_PEER_LOSS") == "exit3":
                    os._exit(3)
                raise
        if sections:
            client.end_section("step")
        client.send_heartbeat()
        time.sleep(step_time)
        step += 1
        if resume_file and RANK == 0:
            write_resume_step(resume_file, resumed + step)
    report_finished = os.environ.get("FT_TEST_REPORT_FINISHED")
    client.shutdown_workload_monitoring(training_finished=report_finished in ("all", str(RANK)))
    if use_torch:
        dist.destroy_process_group()
    if os.environ.get("FT_TEST_MARK_FINISHED") == "1":
        from ft_core.autoresume import mark_training_finished

        mark_training_finished()
    finish_file = os.environ.get("FT_TEST_FINISH_AFTER")
    if finish_file:  # done with the launcher's store and the monitor: only the exit is left
        record(event="finish_waiting", time=time.time())
        while not os.path.exists(finish_file):
            time.sleep(0.02)
    record(event="finished", time=time.time())
    if kind == "abort_at_exit":
        record(event="fault", kind=kind, time=time.time())
        os.abort()
    return 0


if __name__ == "__main__":
    sys.exit(main())
