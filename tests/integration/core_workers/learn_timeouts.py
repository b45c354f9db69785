"""One of two gloo ranks that observe different intervals, then learn timeouts together."""

from __future__ import annotations

import json
import os
import sys
import time

import torch.distributed as dist

from ft_core.client import RankMonitorClient


def main() -> None:
    out_dir = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    client = RankMonitorClient()
    client.init_workload_monitoring()
    # Rank 1 is slower in every phase, so the learned values must come from it.
    step = 0.05 if rank == 0 else 0.2
    gap = 0.02 if rank == 0 else 0.1
    for _ in range(3):
        client.start_section("step")
        time.sleep(step)
        client.end_section("step")
        client.send_heartbeat()
        time.sleep(gap)
    dist.barrier()
    assert client.calculate_and_set_hb_timeouts()
    assert client.calculate_and_set_section_timeouts()
    observed = {
        "step": client._session.calc.section_max["step"],
        "hb_interval": client._session.calc.max_hb_interval,
    }
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
        json.dump({"state": client.state_dict(), "observed": observed}, handle)
    client.shutdown_workload_monitoring()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
