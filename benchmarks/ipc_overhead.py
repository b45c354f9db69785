"""Per-call cost of send_heartbeat() and start_section+end_section, next to a raw socket send.

The baseline is ``socket.send`` of the very same heartbeat frame on the very
same connection, measured in interleaved blocks in the same run so machine
noise hits both alike. Also reports the monitor process's RSS. Prints JSON.

Straggler detection: the main client runs with detection on (the default
config, with a 1 s report interval so the monitor's rounds fall inside the
run) and also times ``record_phase`` (one phase message, what
``client.timed`` sends); a second client on a second monitor with detection
off (``straggler_report_interval: none``) is timed in the same interleaved
blocks (``detection_off``).

    python benchmarks/ipc_overhead.py [--calls 20000]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import emit, rss_mb, summarize  # noqa: E402

from ft_core.client import RankMonitorClient  # noqa: E402
from ft_core.config import FaultToleranceConfig  # noqa: E402
from ft_core.monitor import RankMonitorServer  # noqa: E402

#: Calls per timed block; between blocks the monitor gets time to drain its
#: socket, since Unix-socket buffers hold only ~1000 small frames.
BLOCK = 200


def _time_calls(fn, n: int) -> list[int]:
    clock = time.perf_counter_ns
    samples = []
    for _ in range(n):
        start = clock()
        fn()
        samples.append(clock() - start)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()

    cfg = FaultToleranceConfig(rank_section_timeouts={"step": 3600.0}, log_level="WARNING",
                               straggler_report_interval=1.0)
    cfg_off = FaultToleranceConfig(rank_section_timeouts={"step": 3600.0}, log_level="WARNING",
                                   straggler_report_interval=None)
    with tempfile.TemporaryDirectory() as tmp:
        monitor_off = RankMonitorServer.run_in_subprocess(cfg_off, os.path.join(tmp, "off", "monitor.sock"))
        os.environ["FT_RANK_MONITOR_IPC_SOCKET"] = monitor_off.socket_path
        client_off = RankMonitorClient()
        client_off.init_workload_monitoring()
        monitor = RankMonitorServer.run_in_subprocess(cfg, os.path.join(tmp, "monitor.sock"))
        os.environ["FT_RANK_MONITOR_IPC_SOCKET"] = monitor.socket_path
        client = RankMonitorClient()
        client.init_workload_monitoring()
        try:
            raw_frame = client._hb_frame
            raw_sock = client._sock

            raw_full = 0

            def raw_send() -> None:
                nonlocal raw_full
                try:
                    raw_sock.send(raw_frame)
                except BlockingIOError:
                    raw_full += 1

            def section_pair() -> None:
                client.start_section("step")
                client.end_section("step")

            def section_pair_off() -> None:
                client_off.start_section("step")
                client_off.end_section("step")

            def phase() -> None:
                client.record_phase("forward", 0.001)

            overhead = min(_time_calls(lambda: None, 2000))  # cost of timing an empty call
            heartbeat, raw, sections, phases, heartbeat_off, sections_off = [], [], [], [], [], []
            for _ in range(max(1, args.calls // BLOCK)):
                raw += _time_calls(raw_send, BLOCK)
                heartbeat += _time_calls(client.send_heartbeat, BLOCK)
                sections += _time_calls(section_pair, BLOCK)
                phases += _time_calls(phase, BLOCK)
                heartbeat_off += _time_calls(client_off.send_heartbeat, BLOCK)
                sections_off += _time_calls(section_pair_off, BLOCK)
                time.sleep(0.005)
            monitor_rss = rss_mb(monitor.pid)
            coalesced = client.coalesced_heartbeats
        finally:
            client.shutdown_workload_monitoring()
            client_off.shutdown_workload_monitoring()
            monitor.stop()
            monitor_off.stop()

    us = 1e-3
    hb_summary = summarize(heartbeat, us)
    raw_summary = summarize(raw, us)
    emit({
        "benchmark": "ipc_overhead",
        "unit": "microseconds per call",
        "timer_overhead_us": round(overhead * us, 3),
        "send_heartbeat": hb_summary,
        "raw_socket_send_same_bytes": raw_summary,
        "heartbeat_vs_raw_median_ratio": round(hb_summary["median"] / raw_summary["median"], 2),
        "start_plus_end_section": summarize(sections, us),
        "record_phase": summarize(phases, us),
        "detection_off": {"send_heartbeat": summarize(heartbeat_off, us),
                          "start_plus_end_section": summarize(sections_off, us)},
        "coalesced_heartbeats": coalesced,
        "raw_sends_refused_buffer_full": raw_full,
        "monitor_rss_mb": monitor_rss,
        "targets": {"heartbeat_median_us": 3, "heartbeat_vs_raw": 2.0, "section_pair_median_us": 8,
                    "section_pair_p99_us": 30, "monitor_rss_mb": 30},
    })


if __name__ == "__main__":
    main()
