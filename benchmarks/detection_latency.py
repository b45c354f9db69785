"""Time from a heartbeat deadline passing to the monitor's kill signal, over many trials.

Each trial starts a torch-free rank that sends a few heartbeats and stops.
The monitor records, from its own clock, when the deadline passed, when it
detected the hang and when it sent the termination signal. Trials run with
stack dumps off (pure detection) and on (detection + faulthandler dump).
Prints JSON.

    python benchmarks/detection_latency.py [--trials 20] [--timeout 0.5]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import emit, summarize  # noqa: E402

from ft_core.config import FaultToleranceConfig  # noqa: E402
from ft_core.monitor import RankMonitorServer, read_events  # noqa: E402

RANK_CODE = """
import time
from ft_core.client import RankMonitorClient
client = RankMonitorClient()
client.init_workload_monitoring()
for _ in range(3):
    client.send_heartbeat()
    time.sleep(0.02)
time.sleep(3600)
"""


def run_trials(trials: int, timeout: float, stack_dumps: bool) -> dict:
    cfg = FaultToleranceConfig(rank_heartbeat_timeout=timeout, log_level="CRITICAL",
                               stack_dump_signal="SIGUSR2" if stack_dumps else None)
    with tempfile.TemporaryDirectory() as tmp:
        monitor = RankMonitorServer.run_in_subprocess(cfg, os.path.join(tmp, "monitor.sock"))
        env = dict(os.environ, FT_RANK_MONITOR_IPC_SOCKET=monitor.socket_path)
        try:
            for _ in range(trials):
                rank = subprocess.Popen([sys.executable, "-c", RANK_CODE], env=env)
                try:
                    rank.wait(timeout=60)
                finally:
                    if rank.poll() is None:
                        rank.kill()
                        rank.wait()
            events = read_events(monitor.events_path)[0]
        finally:
            monitor.stop()
    hangs = [e for e in events if e["event"] == "hang_detected"]
    kills = [e for e in events if e["event"] == "rank_terminated"]
    if len(hangs) != trials or len(kills) != trials:
        raise RuntimeError(f"expected {trials} detections, got {len(hangs)} hangs and {len(kills)} kills")
    ms = 1e3
    return {
        "deadline_to_detection_ms": summarize([h["detected_time"] - h["deadline_time"] for h in hangs], ms),
        "deadline_to_kill_ms": summarize([k["time"] - h["deadline_time"] for h, k in zip(hangs, kills)], ms),
        "stacks_captured": sum(1 for h in hangs if h.get("stack")),  # omitted when there is none
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=0.5, help="heartbeat timeout in seconds")
    args = parser.parse_args()
    emit({
        "benchmark": "detection_latency",
        "heartbeat_timeout_s": args.timeout,
        "without_stack_dump": run_trials(args.trials, args.timeout, stack_dumps=False),
        "with_stack_dump": run_trials(args.trials, args.timeout, stack_dumps=True),
        "targets": {"deadline_to_kill_median_ms": 50, "deadline_to_kill_p99_ms": 100},
    })


if __name__ == "__main__":
    main()
