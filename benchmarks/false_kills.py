"""False kills and hang-detection delay with many paced ranks, and with a stalled monitor.

Each run starts a monitor and N torch-free ranks (``tests/integration/core_workers/swarm.py``:
a tracked ``step`` of 50 ms and a heartbeat per iteration); one rank hangs in a step
half way. A false kill is any other rank signalled. The detection delay is measured
end to end: from the moment the rank hung (its own clock) plus its timeout to the
monitor's detection, so time granted for a late monitor is included. The ``stall_3s``
case stops the monitor (SIGSTOP) for 3 s while 4 ranks train and one hangs.

The ``job_life`` scenarios (issue 20) run what the tests run, once each, and count healthy ranks
killed and real hangs caught: ``warmup`` (sections mode, heartbeats off: a hang in each of the 5
warm-up steps, and a first step 3x the step timeout), ``slow_storage`` (a save writing past its
timeout, one hung with no I/O, one writing forever), ``resume`` (a real Lightning job resumed 10
times, each resume with one save 3x the learned step budget; a hang in the 10th) and ``recompile``
(a real ``torch.compile`` model recompiling after learning; a hang inside a compile). Prints JSON.

    python benchmarks/false_kills.py [--runs 3] [--clients 4,64,256] [--job-life-only]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import emit, summarize  # noqa: E402

from ft_core.config import FaultToleranceConfig  # noqa: E402
from ft_core.monitor import RankMonitorServer  # noqa: E402
from ft_core.utils.deadline import wait_until  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWARM = os.path.join(REPO, "tests", "integration", "core_workers", "swarm.py")
RANK = os.path.join(REPO, "tests", "integration", "core_workers", "rank.py")
LIGHTNING = os.path.join(REPO, "tests", "integration", "lightning_scripts")
TOKEN = "bench-token-" + "x" * 8
SECTIONS_NO_HEARTBEATS = {"initial_rank_heartbeat_timeout": None, "rank_heartbeat_timeout": None,
                          "log_level": "CRITICAL"}
STEP_TIMEOUT = 1.0
STEP_S = 0.05


def run_once(clients: int, stall: float = 0.0) -> dict:
    """One run: returns false kills, the hang's detection delay (s) and the monitor's late wake-ups."""
    cfg = FaultToleranceConfig(initial_rank_heartbeat_timeout=120, rank_heartbeat_timeout=4 * STEP_TIMEOUT,
                               rank_section_timeouts={"step": STEP_TIMEOUT}, log_level="CRITICAL")
    hang_after = 1.0 if stall else 1.5
    with tempfile.TemporaryDirectory() as tmp:
        monitor = RankMonitorServer.run_in_subprocess(cfg, os.path.join(tmp, "monitor.sock"))
        env = dict(os.environ, FT_RANK_MONITOR_IPC_SOCKET=monitor.socket_path, PYTHONPATH=REPO)
        swarm = subprocess.Popen(
            [sys.executable, SWARM, "--ranks", str(clients), "--interval", str(STEP_S), "--duration", "4",
             "--hang-rank", "0", "--hang-after", str(hang_after), "--report-dir", tmp],
            env=env, stdout=subprocess.PIPE, text=True)
        try:
            report = os.path.join(tmp, "rank0.json")
            if stall:
                wait_until(lambda: os.path.exists(report), timeout=120, interval=0.01)
                os.kill(monitor.pid, signal.SIGSTOP)
                time.sleep(stall)
                os.kill(monitor.pid, signal.SIGCONT)
            out, _ = swarm.communicate(timeout=300)
            events = monitor.events()
            with open(report) as handle:
                hung_at = json.load(handle)["time"]
        finally:
            if swarm.poll() is None:
                swarm.kill()
                swarm.wait()
            monitor.stop()
    exits = json.loads(out.splitlines()[-1])["exits"]
    hangs = [e for e in events if e["event"] == "hang_detected" and e["rank"] == 0]
    return {
        "false_kills": sum(1 for rank, code in exits.items() if rank != "0" and code != 0),
        "delay": hangs[0]["detected_time"] - (hung_at + hangs[0]["timeout"]) if hangs else None,
        "late": [e["late"] for e in events if e["event"] == "monitor_late"],
    }


def measure(runs: int, clients: int, stall: float = 0.0) -> dict:
    results = [run_once(clients, stall) for _ in range(runs)]
    delays = [r["delay"] for r in results if r["delay"] is not None]
    late = [x for r in results for x in r["late"]]
    return {
        "runs": runs,
        "false_kills": sum(r["false_kills"] for r in results),
        "hangs_missed": runs - len(delays),
        "hang_detect_delay_s": summarize(delays) if delays else None,
        "monitor_late": {"count": len(late), "max_s": round(max(late), 3) if late else 0.0},
    }


# -- job-life scenarios (issue 20) -----------------------------------------------------------------------
def _scenario(cfg: dict, runs: list[tuple[list[str], bool]]) -> dict:
    """Start ``runs`` (argv, healthy?) against one monitor; count healthy runs killed and hangs caught."""
    with tempfile.TemporaryDirectory() as tmp:
        monitor = RankMonitorServer.run_in_subprocess(FaultToleranceConfig.from_kwargs(**cfg),
                                                      os.path.join(tmp, "monitor.sock"), token=TOKEN)
        env = dict(os.environ, FT_RANK_MONITOR_IPC_SOCKET=monitor.socket_path, FT_MONITOR_TOKEN=TOKEN,
                   PYTHONPATH=REPO, OMP_NUM_THREADS="1")
        for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(key, None)
        procs = []
        try:
            for rank, (argv, healthy) in enumerate(runs):
                argv = [arg.replace("{tmp}", tmp) for arg in argv]
                procs.append((subprocess.Popen([sys.executable, *argv], env=dict(env, RANK=str(rank)),
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), healthy))
            codes = [(proc.wait(timeout=600), healthy) for proc, healthy in procs]
        finally:
            for proc, _ in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            monitor.stop()
    killed = [code == -signal.SIGKILL for code, _ in codes]
    return {"healthy": sum(1 for _, healthy in codes if healthy),
            "false_kills": sum(1 for (_, healthy), k in zip(codes, killed) if healthy and k),
            "hangs": sum(1 for _, healthy in codes if not healthy),
            "hangs_caught": sum(1 for (_, healthy), k in zip(codes, killed) if not healthy and k)}


def job_life() -> dict:
    warmup = {**SECTIONS_NO_HEARTBEATS, "rank_section_timeouts": "step:0.5", "rank_out_of_section_timeout": 1.5}
    steps = [([RANK, "steps", "--beats", "0", "--step-times", ",".join(["0.05"] * k), "--then", "hang"], False)
             for k in range(5)]
    slow_first = [([RANK, "steps", "--beats", "0", "--step-times", "1.5,0.05,0.05,0.05,0.05,0.05,0.05"], True)]
    saves = [([RANK, "save", "--beats", "0", "--write-to", f"{{tmp}}/ckpt{n}", "--write-seconds", seconds], healthy)
             for n, (seconds, healthy) in enumerate((("2.0", True), ("0", False), ("-1", False)))]
    lightning = {**SECTIONS_NO_HEARTBEATS, "rank_section_timeouts": "setup:300,step:300,validation:300,"
                 "checkpointing:300", "rank_out_of_section_timeout": 300, "min_calculated_timeout": 0.2}
    resume = [os.path.join(LIGHTNING, "resumes.py"), "--resumes=10", "--out-dir={tmp}"]
    compiled = [os.path.join(LIGHTNING, "compiled.py"), "--out-dir={tmp}/c"]
    return {
        "warmup": _scenario(warmup, steps + slow_first),
        "slow_storage": _scenario({**SECTIONS_NO_HEARTBEATS, "rank_section_timeouts": "checkpointing:1.0"}, saves),
        "resume": _scenario({"min_calculated_timeout": 0.2, "log_level": "CRITICAL"},
                            [(resume, True)]),
        "resume_hang": _scenario({"min_calculated_timeout": 0.2, "log_level": "CRITICAL"},
                                 [([*resume, "--hang-run=10"], False)]),
        "recompile": _scenario({**lightning, "compile_timeout": 3.0},
                               [(compiled, True), ([*compiled[:-1], "--out-dir={tmp}/h", "--hang-compile=2"], False)]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--clients", default="4,64,256", help="comma-separated rank counts")
    parser.add_argument("--job-life-only", action="store_true", help="only the job-life scenarios")
    args = parser.parse_args()
    if args.job_life_only:
        emit({"benchmark": "false_kills", "job_life": job_life()})
        return
    emit({
        "benchmark": "false_kills",
        "step_s": STEP_S,
        "step_timeout_s": STEP_TIMEOUT,
        "clients": {n: measure(args.runs, int(n)) for n in args.clients.split(",")},
        "stall_3s": {"clients": 4, **measure(args.runs, 4, stall=3.0)},
        "job_life": job_life(),
        "targets": {"false_kills": 0, "hang_detect_delay_median_s_quiet": 0.1},
    })


if __name__ == "__main__":
    main()
