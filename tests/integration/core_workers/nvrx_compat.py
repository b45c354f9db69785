"""A training rank for the NVRx-compatibility tests (one scenario per run).

Usage: python nvrx_compat.py SCENARIO OUT_DIR [options]

Learning scenarios join a gloo process group (RANK/WORLD_SIZE/MASTER_* from
the environment); rank 1 is always the slow one. Each rank writes
``OUT_DIR/<scenario>_rank<R>.json`` with its state dict and what it measured
around its own sections (always >= what the client measured inside them).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from ft_core.client import RankMonitorClient


class Rank:
    def __init__(self, out_dir: str, scenario: str) -> None:
        self.out_dir = out_dir
        self.scenario = scenario
        self.rank = int(os.environ.get("RANK", "0"))
        self.client = RankMonitorClient()
        self.measured: dict[str, float] = {}

    def section(self, name: str, seconds: float) -> None:
        started = time.monotonic()
        self.client.start_section(name)
        time.sleep(seconds)
        self.client.end_section(name)
        self.measured[name] = max(self.measured.get(name, 0.0), time.monotonic() - started)

    def write(self, **extra: Any) -> None:
        path = os.path.join(self.out_dir, f"{self.scenario}_rank{self.rank}.json")
        with open(path + ".tmp", "w") as handle:
            json.dump({"state": self.client.state_dict(), "measured": self.measured, **extra}, handle)
        os.replace(path + ".tmp", path)


def hang_in_step(client: RankMonitorClient) -> None:
    client.start_section("step")
    time.sleep(3600)


def one_rank_without_data(r: Rank) -> None:
    """Rank 0 alone sends heartbeats and checkpoints; both must learn from it."""
    r.client.init_workload_monitoring()
    if r.rank == 0:
        started = time.monotonic()
        for gap in (0.1, 0.4, 0.0):
            r.client.send_heartbeat()
            time.sleep(gap)
        r.measured["hb_interval"] = time.monotonic() - started  # >= the largest gap
        r.section("checkpointing", 0.3)
    for _ in range(2):
        r.section("step", 0.05 if r.rank == 0 else 0.3)


def merge_floor(r: Rank, previous: dict[str, Any]) -> None:
    """A small calculated value is loaded *after* a slow step was seen: the merge must not go below it."""
    r.client.init_workload_monitoring()
    r.section("step", 0.1 if r.rank == 0 else 0.6)
    r.client.load_state_dict(previous)  # NVRx: "can be called at any moment"


def slow_phase(r: Rank) -> None:
    r.client.init_workload_monitoring()
    for _ in range(3):
        r.section("step", 0.1 if r.rank == 0 else 0.4)


def fast_phase(r: Rank, previous: dict[str, Any]) -> None:
    """A new cycle resumes with the learned state, then learns on fast steps only."""
    r.client.load_state_dict(previous)
    r.client.init_workload_monitoring()
    for _ in range(5):
        r.section("step", 0.02)


def learn(r: Rank, **calc_kwargs: Any) -> None:
    import torch.distributed as dist

    dist.barrier()
    assert r.client.calculate_and_set_section_timeouts(**calc_kwargs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario")
    parser.add_argument("out_dir")
    parser.add_argument("--state", help="a state dict (JSON file) to load")
    parser.add_argument("--hang", action="store_true", help="rank 1 hangs in a step after learning")
    parser.add_argument("--num-warmup-iters", type=int)
    parser.add_argument("--report-iterations", action="store_true")
    parser.add_argument("--hang-at-step", type=int, default=-1)
    args = parser.parse_args()
    r = Rank(args.out_dir, args.scenario)
    previous = None
    if args.state:
        with open(args.state) as handle:
            previous = json.load(handle)

    if args.scenario == "warmup":
        # No torch: one rank, slow warm-up steps, then a hang.
        r.client.init_workload_monitoring(num_warmup_iters=args.num_warmup_iters)
        r.write(num_warmup_iterations=r.client.cfg.num_warmup_iterations)
        for step in range(3):
            if args.report_iterations:
                r.client.set_iteration(100 + step)
            r.write(reached_step=step, num_warmup_iterations=r.client.cfg.num_warmup_iterations)
            if step == args.hang_at_step:
                hang_in_step(r.client)
            r.section("step", 0.6)
        r.client.shutdown_workload_monitoring()
        return

    import torch.distributed as dist

    dist.init_process_group("gloo")
    if args.scenario == "one_rank_without_data":
        one_rank_without_data(r)
        dist.barrier()
        # Without skip_if_not_ready: these raise if any rank's lack of data blocks the calculation.
        assert r.client.calculate_and_set_hb_timeouts()
        assert r.client.calculate_and_set_section_timeouts()
    elif args.scenario == "merge_floor":
        assert previous is not None
        merge_floor(r, previous)
        learn(r, selected_sections=["step"], calc_out_of_section=False)
    elif args.scenario == "slow_phase":
        slow_phase(r)
        learn(r, selected_sections=["step"], calc_out_of_section=False)
    elif args.scenario == "fast_then_slow":
        assert previous is not None
        fast_phase(r, previous)
        learn(r, selected_sections=["step"], calc_out_of_section=False)
        r.write()  # the learned value, before the slow phase
        for _ in range(3):
            if args.hang and r.rank == 1:
                hang_in_step(r.client)
            r.section("step", 0.1 if r.rank == 0 else 0.4)
    else:
        raise SystemExit(f"unknown scenario {args.scenario}")
    r.write()
    r.client.shutdown_workload_monitoring()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
