"""The command line of the goodput report: ``ft_launcher report LOG_DIR... [--json] [--plot FILE.png]``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Optional

from ft_core.jobdir import LAUNCHER_EVENTS_FILE
from ft_core.launcher.observability.report.analysis import build_report, find_event_files, load_records
from ft_core.launcher.observability.report.plot import plot_timeline
from ft_core.launcher.observability.report.text import format_report

__all__ = ["main"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``ft_launcher report`` / ``python -m ft_core.launcher.observability.report``; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="ft_launcher report", description="Goodput report of a job from its ft_launcher event logs.")
    parser.add_argument("paths", nargs="+", metavar="LOG_DIR",
                        help=f"log directories (searched for {LAUNCHER_EVENTS_FILE.replace('.', '*.', 1)}) or event files")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object (fixed keys)")
    parser.add_argument("--plot", metavar="FILE.png", help="draw the timeline to this file (needs matplotlib)")
    args = parser.parse_args(argv)
    try:
        files = find_event_files(args.paths)
    except FileNotFoundError as exc:
        parser.error(str(exc))
    if not files:
        parser.error(f"no {LAUNCHER_EVENTS_FILE} in {', '.join(args.paths)}")
    report = build_report(load_records(files), files)
    print(json.dumps(report.to_json(), indent=2) if args.json else format_report(report))
    if args.plot:
        try:
            path = plot_timeline(report, args.plot)
        except RuntimeError as exc:
            print(f"ft_launcher report: {exc}", file=sys.stderr)
            return 1
        if not args.json:
            print(f"  timeline       : {os.path.abspath(path)}")
    return 0
