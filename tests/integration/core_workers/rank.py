"""A training rank without torch: talks to the node monitor and misbehaves on request.

Usage: python rank.py SCENARIO [--ready-file F] [--beats N] [--interval S] [--fallback JSON]
                      [--step-times S,S,...] [--then finish|hang] [--stop-file F] ...

``train`` is a healthy training loop (a tracked ``step`` section and a
heartbeat per iteration; ``--interval 0`` is flat out) that can start slowly
(``--startup``), hang on request (``--hang-after``, ``--hang-in``) and ends,
``--tail`` seconds after its last step, with a clean shutdown after
``--duration`` seconds. ``swarm.py`` runs many of them from one interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

from ft_core.client import RankMonitorClient
from ft_core.utils import procutil


def hang_without_heartbeat() -> None:
    time.sleep(3600)


def hang_in_step(client: RankMonitorClient) -> None:
    client.start_section("step")
    time.sleep(3600)


def save(client: RankMonitorClient, args: argparse.Namespace) -> None:
    """A checkpoint save on slow storage: 64 KiB chunks every 0.1 s, in ``--section`` (or out of every section).

    ``--writer child`` forks an async checkpoint writer (as Megatron's and torch DCP's process-based async
    saves do) and waits for it; ``--chatter`` keeps a logging thread writing meanwhile; ``--then hang``
    stays hung (no heartbeat, no storage I/O) once the writing stops.
    """
    if args.chatter:
        threading.Thread(target=_chatter, args=(args,), daemon=True).start()
    if args.section:
        client.start_section(args.section)
    else:  # out of every section: out-of-section time runs from the end of a step
        client.start_section("step")
        client.end_section("step")
    if args.writer == "child":
        pid = os.fork()
        if pid == 0:
            procutil.die_with_parent()  # the test's cleanup kills the rank's group only while the rank runs
            _write(args)
            os._exit(0)
        os.waitpid(pid, 0)
    else:
        _write(args)
    if args.then == "hang":
        hang_without_heartbeat()
    if args.section:
        client.end_section(args.section)
    client.send_heartbeat()
    client.shutdown_workload_monitoring()


def _write(args: argparse.Namespace) -> None:
    """Write ``--write-to`` steadily for ``--write-seconds`` (-1: forever; 0: hang with no I/O)."""
    if args.write_seconds == 0:
        hang_without_heartbeat()
    chunk = b"x" * (64 << 10)
    start = time.monotonic()
    with open(args.write_to, "wb") as handle:
        while args.write_seconds < 0 or time.monotonic() - start < args.write_seconds:
            handle.write(chunk)
            handle.flush()
            time.sleep(0.1)


def _chatter(args: argparse.Namespace) -> None:
    """A logging thread: a line every 50 ms to stdout (a pipe), to stdout redirected to a file, or to a log file."""
    if args.chatter == "stdout-file":  # as torchrun --redirect and tee do
        os.dup2(os.open(args.chatter_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 1)
    stream = open(args.chatter_file, "a") if args.chatter == "log" else sys.stdout  # noqa: SIM115 - lives as long
    while True:
        print("still here, waiting", file=stream, flush=True)
        time.sleep(0.05)


def train(client: RankMonitorClient, args: argparse.Namespace) -> int:
    """Train for ``args.duration`` seconds; returns the number of iterations."""
    time.sleep(args.startup)  # start-up work before the first section (imports, data, model)
    start = time.monotonic()
    iteration = 0
    while (elapsed := time.monotonic() - start) < args.duration:
        client.set_iteration(iteration)
        if args.hang_after is not None and elapsed >= args.hang_after:
            client.send_heartbeat()  # the monitor knows the iteration the rank hangs in
            _report(client, args, iteration, hung=True)
            if args.hang_in == "step":
                hang_in_step(client)
            hang_without_heartbeat()  # out of every section
        client.start_section("step")
        if args.interval:
            time.sleep(args.interval)
        client.end_section("step")
        client.send_heartbeat()
        iteration += 1
    time.sleep(args.tail)  # untracked work after the last step (a final save, say)
    _report(client, args, iteration, hung=False)
    client.shutdown_workload_monitoring()
    return iteration


def _report(client: RankMonitorClient, args: argparse.Namespace, iteration: int, hung: bool) -> None:
    if args.report_dir:
        with open(os.path.join(args.report_dir, f"rank{client.rank}.json"), "w") as handle:
            json.dump({"iteration": iteration, "hung": hung, "time": time.time(),
                       "coalesced": client.coalesced_heartbeats}, handle)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario")
    parser.add_argument("--ready-file")
    parser.add_argument("--beats", type=int, default=5)
    parser.add_argument("--interval", type=float, default=0.05)
    parser.add_argument("--fallback", type=json.loads, default=None, help="fallback_config as JSON")
    parser.add_argument("--stop-file", help="heartbeat_forever: stop heartbeating (hang) once this file exists")
    parser.add_argument("--step-times", default="", help="'steps': seconds of each step section, comma-separated")
    parser.add_argument("--then", choices=["finish", "hang"], default="finish", help="'steps', 'save': after the steps, the writing")
    parser.add_argument("--duration", type=float, default=5.0, help="train: seconds of training")
    parser.add_argument("--startup", type=float, default=0.0, help="train: seconds before the first step")
    parser.add_argument("--hang-after", type=float, default=None, help="train: hang after this many seconds")
    parser.add_argument("--hang-in", choices=("step", "out_of_section"), default="step")
    parser.add_argument("--tail", type=float, default=0.0, help="train: seconds between the last step and shutdown")
    parser.add_argument("--report-dir", help="train: write rank<N>.json (iteration, coalesced) there at the end")
    parser.add_argument("--write-to", help="save: the file the checkpoint is written to")
    parser.add_argument("--write-seconds", type=float, default=0.0,
                        help="save: seconds of slow writing in the section (-1: forever; 0: hang with no I/O)")
    parser.add_argument("--section", default="checkpointing", help="save: the section ('': out of every section)")
    parser.add_argument("--writer", choices=("self", "child"), default="self", help="save: who writes")
    parser.add_argument("--chatter", choices=("stdout", "stdout-file", "log"), help="save: a thread writes logs")
    parser.add_argument("--chatter-file", help="save: the file of --chatter stdout-file or log")
    return parser


def main() -> None:
    args = build_parser().parse_args()

    megatron_args = None
    if args.scenario.startswith("megatron_"):
        # Stands in for Megatron-LM's global args module, set up before FT init as Megatron-LM does.
        import types

        megatron_args = types.SimpleNamespace(curr_iteration=100)
        sys.modules["megatron.training.global_vars"] = types.SimpleNamespace(_GLOBAL_ARGS=megatron_args)
    client = RankMonitorClient()
    client.init_workload_monitoring(fallback_config=args.fallback)
    cfg = client.cfg.to_dict()  # the monitor's config for this rank, from its HelloAck
    if args.ready_file:
        with open(args.ready_file, "w") as handle:
            handle.write(str(os.getpid()))

    if args.scenario == "train":
        print(json.dumps({"iterations": train(client, args), "coalesced": client.coalesced_heartbeats}))
        return
    if args.scenario == "no_first_heartbeat":
        hang_without_heartbeat()
    for i in range(args.beats):
        if megatron_args is not None:
            megatron_args.curr_iteration = 100 + i  # Megatron's loop advances it; the client reads it
        else:
            client.set_iteration(i)
        client.send_heartbeat()
        time.sleep(args.interval)
    if args.scenario in ("heartbeat_gap", "megatron_heartbeat_gap"):
        hang_without_heartbeat()
    elif args.scenario == "step_in_other_section":
        client.start_section("outer")  # tracked without a deadline
        for step in range(3):
            client.set_iteration(args.beats + step)  # one iteration per step, as training loops report
            client.start_section("step")
            time.sleep(args.interval)
            client.end_section("step")
        client.set_iteration(args.beats + 3)
        hang_in_step(client)
    elif args.scenario == "steps":
        step_times = [float(seconds) for seconds in filter(None, args.step_times.split(","))]
        for step, seconds in enumerate(step_times):
            client.set_iteration(args.beats + step)  # one iteration per step, as training loops report
            client.start_section("step")
            time.sleep(seconds)
            client.end_section("step")
        if args.then == "hang":
            client.set_iteration(args.beats + len(step_times))  # the next iteration hangs
            hang_in_step(client)
        client.shutdown_workload_monitoring()
    elif args.scenario == "save":
        save(client, args)
    elif args.scenario == "out_of_section":
        client.start_section("step")
        client.end_section("step")
        hang_without_heartbeat()
    elif args.scenario == "shutdown_then_idle":
        client.shutdown_workload_monitoring()
        time.sleep(float(os.environ.get("IDLE_AFTER_SHUTDOWN", "2")))
    elif args.scenario == "heartbeat_forever":
        while not (args.stop_file and os.path.exists(args.stop_file)):
            client.send_heartbeat()
            time.sleep(args.interval)
        hang_without_heartbeat()
    elif args.scenario == "finish":
        client.shutdown_workload_monitoring()
    else:
        raise SystemExit(f"unknown scenario {args.scenario}")
    print(json.dumps({"coalesced": client.coalesced_heartbeats, "cfg": cfg}))


if __name__ == "__main__":
    main()
