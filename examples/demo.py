"""The main demo (``make demo``): a 2-rank Lightning job hangs, is caught, restarted and finishes.

It runs the Hydra recipe under ``ft_launcher`` with an injected hang on rank 1:

    ft_launcher --nproc-per-node=2 --max-restarts=3 --log-dir outputs/demo/logs \
        recipes/train.py fault_tolerance=sections fault=hang_rank1

The launcher's and monitor's output is shown as it happens (Lightning's
routine chatter is filtered; the full log is kept in ``outputs/demo``), then a
recap is built from the launcher's event log, followed by the goodput report of
the run and the path of its timeline picture. Extra arguments are passed to
the recipe as Hydra overrides, e.g. ``python examples/demo.py trainer.max_steps=40``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

from ft_core.event_file import read_events
from ft_core.events import EventName
from ft_core.jobdir import FINISHED_FLAG_ENV, LAUNCHER_EVENTS_FILE
from ft_core.launcher.observability.report import (
    build_report,
    find_event_files,
    format_report,
    load_records,
    plot_timeline,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO, "outputs", "demo")
#: Routine Lightning/torch lines that say nothing about fault tolerance.
NOISE = re.compile(
    r"Warning|warnings\.warn|deprecated|Tip:|GPU available|TPU available|HPU available|LOCAL_RANK:|"
    r"^-{10,}|distributed_backend=|All distributed processes|Initializing distributed|Checkpoint directory|"
    r"isinstance\(treespec|is not resumable|You're resuming|dataloader|^\s*$|\| Name|Trainable params|"
    r"Non-trainable|Total params|Total estimated|Modules in|^\s*warnings|W\d{4} \d\d:"
)


def main() -> int:
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    logs, flag = os.path.join(OUT, "logs"), os.path.join(OUT, "finished.flag")
    env = dict(os.environ, PYTHONWARNINGS="ignore", PYTHONUNBUFFERED="1", **{FINISHED_FLAG_ENV: flag})
    command = [sys.executable, "-m", "ft_core.launcher", "--nproc-per-node=2", "--max-restarts=3",
               f"--log-dir={logs}", os.path.join(REPO, "recipes", "train.py"),
               "fault_tolerance=sections", "fault=hang_rank1", "run_name=demo", *sys.argv[1:]]
    print("$ ft_launcher " + " ".join(command[3:]), flush=True)
    with open(os.path.join(OUT, "launcher.log"), "w") as full_log:
        proc = subprocess.Popen(command, env=env, cwd=OUT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            full_log.write(line)
            if not NOISE.search(line):
                print(line, end="", flush=True)
        code = proc.wait()
    return recap(code, os.path.join(logs, LAUNCHER_EVENTS_FILE), flag)


def recap(code: int, events_path: str, flag: str) -> int:
    events = read_events(events_path)[0]
    hangs = [e for e in events if e["event"] == EventName.HANG_DETECTED]
    restarts = [e for e in events if e["event"] == EventName.RESTART]
    cycles = [e for e in events if e["event"] == EventName.CYCLE_START]
    progress = [e["iteration"] for e in events if e["event"] == EventName.PROGRESS]
    print("\n================ what happened ================")
    # In a collective hang every rank waits: the stacks tell the culprit from its peers.
    for hang in hangs:
        print(f"hang      : rank {hang['rank']} stuck in section {hang['section']!r} at iteration "
              f"{hang['iteration']} ({hang['elapsed']:.2f} s > timeout {hang['timeout']:.2f} s), detected "
              f"{(hang['time'] - hang['deadline_time']) * 1e3:.0f} ms after the deadline")
        print(f"  stack   : {hang['stack_dump_file']}")
        for frame in _innermost_frames(hang.get("stack_dump_file"), 2):
            print(f"            {frame}")
    for restart in restarts:
        print(f"restart   : cycle {restart['cycle']} ended by a {restart['kind']}; "
              f"{restart['restarts']}/{restart['max_restarts']} restarts used")
    resumed_from = _checkpoints_before_cycle(events, 1)
    if resumed_from:
        print(f"resume    : cycle 1 resumed from the checkpoint of iteration {resumed_from[-1]}")
    print(f"completed : last checkpointed iteration {max(progress) if progress else 'none'}, "
          f"{len(cycles)} cycles, finished flag {'written' if os.path.exists(flag) else 'MISSING'}")
    print(f"exit code : {code}")
    print()
    # The goodput report of this run, as `ft_launcher report outputs/demo/logs --plot ...` prints it.
    files = find_event_files([os.path.dirname(events_path)])
    report = build_report(load_records(files), files)
    print(format_report(report))
    try:
        picture = plot_timeline(report, os.path.join(OUT, "timeline.png"))
        print(f"  timeline       : {picture}")
    except RuntimeError as exc:  # matplotlib missing: the extra "report" is not installed
        print(f"  timeline       : not drawn ({exc})")
    ok = code == 0 and hangs and restarts and os.path.exists(flag)
    return 0 if ok else 1


def _innermost_frames(path: str | None, count: int) -> list[str]:
    """The innermost frames of the main thread in a faulthandler dump."""
    if not path or not os.path.exists(path):
        return []
    with open(path) as handle:
        frames = [line.strip() for line in handle if line.strip().startswith("File")]
    return frames[:count]


def _checkpoints_before_cycle(events: list[dict], cycle: int) -> list[int]:
    """Checkpoint iterations reported before ``cycle`` started: the newest is where it resumed."""
    iterations = []
    for event in events:
        if event["event"] == EventName.CYCLE_START and event["cycle"] == cycle:
            break
        if event["event"] == EventName.PROGRESS:
            iterations.append(event["iteration"])
    return iterations


if __name__ == "__main__":
    sys.exit(main())
