"""A training rank without torch: talks to the node monitor and misbehaves on request.

Usage: python rank.py SCENARIO [--ready-file F] [--state-file F]
"""

from __future__ import annotations

import argparse
import json
import os
import time

from ft_core.client import RankMonitorClient


def hang_without_heartbeat() -> None:
    time.sleep(3600)


def hang_in_step(client: RankMonitorClient) -> None:
    client.start_section("step")
    time.sleep(3600)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario")
    parser.add_argument("--ready-file")
    parser.add_argument("--beats", type=int, default=5)
    parser.add_argument("--interval", type=float, default=0.05)
    args = parser.parse_args()

    megatron_args = None
    if args.scenario.startswith("megatron_"):
        # Stands in for Megatron-LM's global args module, set up before FT init as Megatron-LM does.
        import sys
        import types

        megatron_args = types.SimpleNamespace(curr_iteration=100)
        sys.modules["megatron.training.global_vars"] = types.SimpleNamespace(_GLOBAL_ARGS=megatron_args)
    client = RankMonitorClient()
    client.init_workload_monitoring()
    if args.ready_file:
        with open(args.ready_file, "w") as handle:
            handle.write(str(os.getpid()))

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
        for _ in range(3):
            client.start_section("step")
            time.sleep(args.interval)
            client.end_section("step")
        hang_in_step(client)
    elif args.scenario == "out_of_section":
        client.start_section("step")
        client.end_section("step")
        hang_without_heartbeat()
    elif args.scenario == "shutdown_then_idle":
        client.shutdown_workload_monitoring()
        time.sleep(float(os.environ.get("IDLE_AFTER_SHUTDOWN", "2")))
    elif args.scenario == "heartbeat_forever":
        while True:
            client.send_heartbeat()
            time.sleep(args.interval)
    elif args.scenario == "finish":
        client.shutdown_workload_monitoring()
    else:
        raise SystemExit(f"unknown scenario {args.scenario}")
    print(json.dumps({"dropped": client.dropped_heartbeats}))


if __name__ == "__main__":
    main()
