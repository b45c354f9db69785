"""One of two gloo ranks that agree through :mod:`ft_core.all_ranks` (``all_ranks.py OUT_DIR``).

Each rank offers values that differ by rank, and writes what every helper answered to
``<OUT_DIR>/rank<RANK>.json``; before ``init_process_group`` and after its destruction
the helpers answer with the rank's own values.
"""

from __future__ import annotations

import json
import os
import sys

import torch.distributed as dist

from ft_core.all_ranks import all_ranks_max, all_ranks_ok, distributed, every_rank


def answers(rank: int) -> dict[str, object]:
    return {
        "distributed": distributed(),
        "ok_when_all": all_ranks_ok(True),
        "ok_when_one_fails": all_ranks_ok(rank != 1),
        # Integers beyond a float's 53 bits stay exact; a negative value loses to any other.
        "max_ints": all_ranks_max([rank, -1 if rank == 0 else 2**60 + 1, 7 - rank]),
        "max_floats": all_ranks_max([0.25 * (rank + 1), -1.0, 1e-9 if rank == 1 else 0.0]),
        "every_rank": every_rank({"rank": rank, "held": [[rank * 10, "a"]]}),
    }


def main() -> None:
    out_dir = sys.argv[1]
    rank = int(os.environ["RANK"])
    before = answers(rank)
    dist.init_process_group("gloo")
    during = answers(rank)
    dist.destroy_process_group()
    after = answers(rank)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w", encoding="utf-8") as handle:
        json.dump({"before": before, "during": during, "after": after}, handle)


if __name__ == "__main__":
    main()
