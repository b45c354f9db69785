"""Small shared helpers for the benchmark scripts (statistics and JSON output)."""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import sys
from collections.abc import Sequence
from typing import Any


def summarize(samples: Sequence[float], scale: float = 1.0, digits: int = 3) -> dict[str, Any]:
    """Median, p99, min and max of ``samples`` multiplied by ``scale``."""
    ordered = sorted(s * scale for s in samples)
    p99_index = min(len(ordered) - 1, max(0, round(0.99 * (len(ordered) - 1))))
    return {
        "n": len(ordered),
        "median": round(statistics.median(ordered), digits),
        "p99": round(ordered[p99_index], digits),
        "min": round(ordered[0], digits),
        "max": round(ordered[-1], digits),
    }


def host() -> dict[str, Any]:
    """Where and when a benchmark ran: the Measured table (docs/measured.md) names the machine and the date from this."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            model = next(line.split(":", 1)[1].strip() for line in handle if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"python": sys.version.split()[0], "machine": platform.machine(), "cpu": model, "cpus": os.cpu_count(),
            "date": datetime.date.today().isoformat(), "load_avg_1m": round(os.getloadavg()[0], 2)}


def emit(result: dict[str, Any]) -> None:
    """Print a benchmark's result as JSON on stdout, with ``host``."""
    result.setdefault("host", host())
    print(json.dumps(result, indent=2))


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no VmRSS for pid {pid}")
