"""A plain-torch (or Megatron-hooks) training loop under plain torchrun, watched by the standalone monitor.

``--via client``: ``connect_standalone(RankMonitorClient(), cfg)`` and sections by hand.
``--via megatron``: ``start_standalone(cfg)`` then the Megatron hooks (``ft.setup(args)`` connects).
Each rank writes ``<out>/done_r<rank>`` when it finished every step.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist

from ft_core.client import RankMonitorClient
from ft_core.config import FaultToleranceConfig
from ft_core.monitor.standalone import connect_standalone, start_standalone
from ft_integrations import megatron as ft


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--via", choices=("client", "megatron"), required=True)
    parser.add_argument("--config-json", required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--step-time", type=float, default=0.0)
    parser.add_argument("--hang-rank", type=int, default=-1)
    parser.add_argument("--hang-step", type=int, default=-1)
    parser.add_argument("--out", required=True)
    ft.add_ft_args(parser)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cfg = FaultToleranceConfig.from_mapping(json.loads(args.config_json))

    if args.via == "client":
        client = RankMonitorClient()
        connect_standalone(client, cfg)
        start, end, finish = (lambda i: client.start_section("step"), lambda: client.end_section("step"),
                              client.shutdown_workload_monitoring)
    else:
        start_standalone(cfg)
        ft.setup(args)
        start, end, finish = ft.on_training_step_start, ft.on_training_step_end, ft.shutdown

    for step in range(args.steps):
        start(step)
        if rank == args.hang_rank and step == args.hang_step:
            time.sleep(3600)  # the hang: the monitor must kill this rank
        time.sleep(args.step_time)
        tensor = torch.ones(1)
        dist.all_reduce(tensor)
        end()
    finish()
    dist.destroy_process_group()
    with open(os.path.join(args.out, f"done_r{rank}"), "w", encoding="utf-8") as handle:
        handle.write("ok")


if __name__ == "__main__":
    main()
