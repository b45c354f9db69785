"""Many torch-free ranks from one interpreter: ``rank.py train``, forked once per rank (cheap to start).

Usage: python swarm.py --ranks N [--hang-rank R] [the train options of rank.py]

Each child is a real process with its own client and connection (``RANK`` =
its index); only rank ``--hang-rank`` obeys ``--hang-after``. All ranks connect
first and start training together once every rank is connected (otherwise the
early ranks' load would starve the forking parent and the late handshakes). Prints one JSON line once every
rank has ended: ``{"exits": {rank: exit code, or -signal}}``.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

import rank as rank_worker

from ft_core.client import RankMonitorClient
from ft_core.utils import procutil


def run_rank(index: int, args, connected: int, go: int) -> int:
    procutil.die_with_parent()
    os.environ["RANK"] = os.environ["LOCAL_RANK"] = str(index)
    if index != args.hang_rank:
        args.hang_after = None
    try:
        client = RankMonitorClient()
        client.init_workload_monitoring()
        os.write(connected, b".")
        os.read(go, 1)  # returns (empty) when the parent closes the pipe: every rank is connected
        rank_worker.train(client, args)
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def main() -> None:
    parser = rank_worker.build_parser()
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--hang-rank", type=int, default=None)
    args = parser.parse_args(["train", *sys.argv[1:]])
    connected_r, connected_w = os.pipe()
    go, start = os.pipe()
    children = {}
    for index in range(args.ranks):
        pid = os.fork()
        if pid == 0:
            os.close(start)
            os.close(connected_r)
            os._exit(run_rank(index, args, connected_w, go))
        children[pid] = index
    os.close(connected_w)
    remaining = args.ranks
    while remaining and (data := os.read(connected_r, remaining)):  # empty: every child exited
        remaining -= len(data)
    os.close(start)
    exits = {}
    while children:
        pid, status = os.wait()
        exits[children.pop(pid)] = os.waitstatus_to_exitcode(status)
    print(json.dumps({"exits": dict(sorted(exits.items()))}), flush=True)


if __name__ == "__main__":
    main()
