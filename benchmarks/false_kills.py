"""False kills and hang-detection delay with many paced ranks, and with a stalled monitor.

Each run starts a monitor and N torch-free ranks (``tests/integration/core_workers/swarm.py``:
a tracked ``step`` of 50 ms and a heartbeat per iteration); one rank hangs in a step
half way. A false kill is any other rank signalled. The detection delay is measured
end to end: from the moment the rank hung (its own clock) plus its timeout to the
monitor's detection, so time granted for a late monitor is included. The ``stall_3s``
case stops the monitor (SIGSTOP) for 3 s while 4 ranks train and one hangs. Prints JSON.

    python benchmarks/false_kills.py [--runs 3] [--clients 4,64,256]
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
from ft_core.deadline import wait_until  # noqa: E402
from ft_core.monitor import RankMonitorServer  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWARM = os.path.join(REPO, "tests", "integration", "core_workers", "swarm.py")
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--clients", default="4,64,256", help="comma-separated rank counts")
    args = parser.parse_args()
    emit({
        "benchmark": "false_kills",
        "step_s": STEP_S,
        "step_timeout_s": STEP_TIMEOUT,
        "clients": {n: measure(args.runs, int(n)) for n in args.clients.split(",")},
        "stall_3s": {"clients": 4, **measure(args.runs, 4, stall=3.0)},
        "targets": {"false_kills": 0, "hang_detect_delay_median_s_quiet": 0.1},
    })


if __name__ == "__main__":
    main()
