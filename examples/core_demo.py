"""Core demo: a node monitor watches two ranks; one hangs, is caught with its stack, the other finishes.

No launcher involved: this is what ``RankMonitorServer.run_in_subprocess``
gives plain ``torchrun``/``srun`` users. Run: ``python examples/core_demo.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap

from ft_core.config import FaultToleranceConfig
from ft_core.event_file import read_events
from ft_core.events import EventName
from ft_core.jobdir import MONITOR_SOCKET_ENV, JobDir
from ft_core.monitor import RankMonitorServer

RANK_CODE = textwrap.dedent("""
    import os, time
    from ft_core.client import RankMonitorClient

    def load_next_batch(rank, step):
        if rank == 1 and step == 5:
            time.sleep(3600)  # a data loader that never returns

    client = RankMonitorClient()
    client.init_workload_monitoring()
    rank = client.rank
    client.start_section("setup"); time.sleep(0.2); client.end_section("setup")
    for step in range(10):
        client.set_iteration(step)
        client.start_section("step")
        load_next_batch(rank, step)
        time.sleep(0.1)
        client.end_section("step")
    print(f"rank {rank}: training finished", flush=True)
    client.shutdown_workload_monitoring()
""")


def main() -> int:
    sys.stdout.reconfigure(line_buffering=True)  # interleave with the monitor's log in order
    cfg = FaultToleranceConfig(rank_section_timeouts={"setup": 30, "step": 1.5}, rank_heartbeat_timeout=None)
    with tempfile.TemporaryDirectory(prefix="ft-demo-") as job_dir:
        monitor = RankMonitorServer.run_in_subprocess(cfg, JobDir(job_dir).monitor_socket)
        print(f"monitor pid {monitor.pid} watching 2 ranks; 'step' timeout {cfg.rank_section_timeouts['step']} s")
        env = dict(os.environ, **{MONITOR_SOCKET_ENV: monitor.socket_path})
        ranks = [subprocess.Popen([sys.executable, "-c", RANK_CODE], env=dict(env, RANK=str(r)))
                 for r in range(2)]
        try:
            codes = [proc.wait(timeout=120) for proc in ranks]
        finally:
            for proc in ranks:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            monitor.stop()
        events = read_events(monitor.events_path)[0]
    print("\n=== summary ===")
    for rank, code in enumerate(codes):
        print(f"rank {rank}: exit code {code}" + (" (killed by the monitor)" if code < 0 else ""))
    for hang in (e for e in events if e["event"] == EventName.HANG_DETECTED):
        print(f"hang: rank {hang['rank']} in section {hang['section']!r} at iteration {hang['iteration']}, "
              f"{hang['elapsed']} s > {hang['timeout']} s; detected "
              f"{(hang['detected_time'] - hang['deadline_time']) * 1e3:.1f} ms after the deadline")
    return 0 if codes[0] == 0 and codes[1] < 0 else 1


if __name__ == "__main__":
    sys.exit(main())
