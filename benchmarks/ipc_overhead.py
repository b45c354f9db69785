"""Per-call cost of send_heartbeat() and start_section+end_section, next to a raw socket send.

The floor is ``socket.send`` of the very same heartbeat frame on the very same
connection, measured in the same run so machine noise hits both alike.

* Tight loop: blocks of back-to-back calls of each kind, interleaved.
* ``--paced``: one call per simulated training step, every ``--interval-ms``
  (1 and 20 by default), with a cache-polluting workload (a 1 MiB copy and
  some Python work) before each call, as a training step would leave the
  caches. Calls rotate heartbeat / section pair / raw send, so each kind sees
  the same conditions. Ratios are medians over ``BLOCKS`` consecutive blocks,
  with their spread (min-max over the blocks).

Straggler detection: the main client runs with detection on (a 1 s report
interval, so the monitor's rounds fall inside the run) and the tight loop also
times ``record_phase`` (one phase message, what ``client.timed`` sends); a
second client on a second monitor with detection off
(``straggler_report_interval: none``) is timed in the same interleaved blocks
(``detection_off``).

``--megatron``: the clients read the iteration from Megatron-LM's global args
(a stand-in ``megatron.training.global_vars`` whose ``_GLOBAL_ARGS`` is set
after the clients' init, as Megatron-LM's ``initialize_megatron`` does after
``ft_integration.setup()``), the path of Megatron-LM's unmodified ``ft_integration``.

Also reports the monitor process's RSS. Prints JSON.

    python benchmarks/ipc_overhead.py [--calls 20000] [--paced] [--interval-ms 1 --interval-ms 20] [--megatron]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import types
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import emit, rss_mb, summarize  # noqa: E402

from ft_core.client import RankMonitorClient  # noqa: E402
from ft_core.config import FaultToleranceConfig  # noqa: E402
from ft_core.monitor import RankMonitorServer  # noqa: E402

#: Calls per timed block; between blocks the monitor gets time to drain its
#: socket, since Unix-socket buffers hold only ~1000 small frames.
BLOCK = 200
#: Paced runs: ratios are computed per block of consecutive samples; the spread is over blocks.
BLOCKS = 5
#: Paced runs: simulated steps per interval (each step times one call, rotating over the kinds).
PACED_STEPS = {1.0: 3000, 20.0: 750}

_SCRATCH = bytearray(1 << 20)
_SOURCE = bytes(range(256)) * 4096
_DOC = {"step": 1, "loss": 0.5, "lr": [1e-3] * 64, "names": [f"layer{i}" for i in range(64)]}


def _pollute() -> None:
    """What a training step does to the caches between two calls: touch 1 MiB, run other Python code."""
    _SCRATCH[:] = _SOURCE
    json.loads(json.dumps(_DOC))


def _time_calls(fn: Callable[[], None], n: int) -> list[int]:
    clock = time.perf_counter_ns
    samples = []
    for _ in range(n):
        start = clock()
        fn()
        samples.append(clock() - start)
    return samples


def _paced(kinds: dict[str, Callable[[], None]], interval_ms: float, steps: int) -> dict[str, list[int]]:
    clock = time.perf_counter_ns
    names = list(kinds)
    samples: dict[str, list[int]] = {name: [] for name in names}
    interval = interval_ms / 1000.0
    next_step = time.perf_counter()
    for step in range(steps):
        _pollute()
        name = names[step % len(names)]
        fn = kinds[name]
        start = clock()
        fn()
        samples[name].append(clock() - start)
        next_step += interval
        delay = next_step - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        else:  # the machine is slower than the pace: do not burst to catch up
            next_step = time.perf_counter()
    return samples


def _ratio_spread(numerator: list[int], denominator: list[int], scale: float = 1.0) -> dict[str, float]:
    """Median ratio of ``numerator`` to ``denominator`` (times ``scale``) per block: median, min, max."""
    size = min(len(numerator), len(denominator)) // BLOCKS
    ratios = [statistics.median(numerator[i * size:(i + 1) * size]) /
              (scale * statistics.median(denominator[i * size:(i + 1) * size])) for i in range(BLOCKS)]
    return {"median": round(statistics.median(ratios), 3), "min": round(min(ratios), 3),
            "max": round(max(ratios), 3), "blocks": BLOCKS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000, help="tight loop: calls of each kind")
    parser.add_argument("--paced", action="store_true", help="also measure one call per simulated step")
    parser.add_argument("--interval-ms", type=float, action="append", help="paced step interval (repeatable)")
    parser.add_argument("--megatron", action="store_true",
                        help="iterations from Megatron-LM's global args, set after the clients' init")
    args = parser.parse_args()
    intervals = args.interval_ms or sorted(PACED_STEPS)

    cfg = FaultToleranceConfig(rank_section_timeouts={"step": 3600.0}, log_level="WARNING",
                               straggler_report_interval=1.0)
    cfg_off = FaultToleranceConfig(rank_section_timeouts={"step": 3600.0}, log_level="WARNING",
                                   straggler_report_interval=None)
    result: dict[str, Any] = {"benchmark": "ipc_overhead", "unit": "microseconds per call",
                              "iteration_source": "megatron_args" if args.megatron else "none"}
    megatron_vars = types.ModuleType("megatron.training.global_vars")
    megatron_vars._GLOBAL_ARGS = None  # type: ignore[attr-defined]
    if args.megatron:
        sys.modules["megatron.training.global_vars"] = megatron_vars
    with tempfile.TemporaryDirectory() as tmp:
        monitor_off = RankMonitorServer.run_in_subprocess(cfg_off, os.path.join(tmp, "off", "monitor.sock"))
        os.environ["FT_RANK_MONITOR_IPC_SOCKET"] = monitor_off.socket_path
        client_off = RankMonitorClient()
        client_off.init_workload_monitoring()
        monitor = RankMonitorServer.run_in_subprocess(cfg, os.path.join(tmp, "monitor.sock"))
        os.environ["FT_RANK_MONITOR_IPC_SOCKET"] = monitor.socket_path
        client = RankMonitorClient()
        client.init_workload_monitoring()
        # initialize_megatron() sets the args after ft_integration.setup() connected the client.
        megatron_vars._GLOBAL_ARGS = types.SimpleNamespace(curr_iteration=100)  # type: ignore[attr-defined]
        try:
            raw_frame = bytes(client._hb_frames.frame(100))  # the heartbeat the calls send (iteration 100)
            session = client._session
            assert session is not None
            raw_sock = session.sock

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

            kinds = {"heartbeat": client.send_heartbeat, "section_pair": section_pair, "raw_send": raw_send}
            tight_only = {"phase": phase, "heartbeat_off": client_off.send_heartbeat,
                          "section_pair_off": section_pair_off}
            overhead = min(_time_calls(lambda: None, 2000))  # cost of timing an empty call
            tight: dict[str, list[int]] = {name: [] for name in {**kinds, **tight_only}}
            for _ in range(max(1, args.calls // BLOCK)):
                for name, fn in {**kinds, **tight_only}.items():
                    tight[name] += _time_calls(fn, BLOCK)
                time.sleep(0.005)
            paced = {interval: _paced(kinds, interval, PACED_STEPS.get(interval, 1000)) for interval in intervals} \
                if args.paced else {}
            result["monitor_rss_mb"] = rss_mb(monitor.pid)
            result["coalesced_heartbeats"] = client.coalesced_heartbeats
            result["raw_sends_refused_buffer_full"] = raw_full
        finally:
            client.shutdown_workload_monitoring()
            client_off.shutdown_workload_monitoring()
            monitor.stop()
            monitor_off.stop()

    us = 1e-3
    hb_summary = summarize(tight["heartbeat"], us)
    raw_summary = summarize(tight["raw_send"], us)
    result.update({
        "timer_overhead_us": round(overhead * us, 3),
        "send_heartbeat": hb_summary,
        "raw_socket_send_same_bytes": raw_summary,
        "heartbeat_vs_raw_median_ratio": round(hb_summary["median"] / raw_summary["median"], 2),
        "start_plus_end_section": summarize(tight["section_pair"], us),
        "record_phase": summarize(tight["phase"], us),
        "detection_off": {"send_heartbeat": summarize(tight["heartbeat_off"], us),
                          "start_plus_end_section": summarize(tight["section_pair_off"], us)},
    })
    if paced:
        result["paced"] = [{
            "interval_ms": interval,
            "heartbeat_us": summarize(samples["heartbeat"], us),
            "section_pair_us": summarize(samples["section_pair"], us),
            "raw_send_us": summarize(samples["raw_send"], us),
            "heartbeat_vs_raw": _ratio_spread(samples["heartbeat"], samples["raw_send"]),
            "section_pair_vs_two_raw": _ratio_spread(samples["section_pair"], samples["raw_send"], scale=2.0),
            "p99_over_median": {name: round(statistics.quantiles(values, n=100)[98] / statistics.median(values), 2)
                                for name, values in samples.items()},
        } for interval, samples in paced.items()]
    result["targets"] = {"paced_heartbeat_vs_raw": 1.3, "paced_section_pair_vs_two_raw": 2.0,
                         "paced_p99_over_median": 5.0, "monitor_rss_mb": 30}
    emit(result)


if __name__ == "__main__":
    main()
