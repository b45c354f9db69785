"""The live ranks' evidence: the monitor waits for the stack dumps it asked for, then classifies each stack."""

from __future__ import annotations

from ft_core.events import RankEvidence
from ft_core.monitor.hang import DumpWait
from ft_core.monitor.live_ranks import LiveRanksEvidence

IN_ALL_REDUCE = """Current thread 0x00007f0000000001 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2501 in all_reduce
  File "/job/train.py", line 40 in main
"""
IN_SLEEP = """Thread 0x00007f0000000001 (most recent call first):
  File "/job/train.py", line 12 in inject
  File "/job/train.py", line 40 in main
"""


def ev(rank, **fields):
    fields.setdefault("last_activity", 100.0)
    return RankEvidence(rank=rank, pid=100 + rank, node="h:1", **fields)


def test_live_ranks_evidence_waits_for_every_dump_then_classifies_each_stack():
    evidence = LiveRanksEvidence()
    evidence.add(ev(1, iteration=3), "/d1", DumpWait(offset=10, deadline=51.0))
    evidence.add(ev(0, iteration=3), "/d0", DumpWait(offset=0, deadline=51.0))
    evidence.add(ev(2, iteration=3))  # no dump asked (it cannot dump): recorded as it is
    sizes = {"/d0": 0, "/d1": 10}
    assert evidence.poll(50.0, sizes.__getitem__) is not None  # nothing written yet
    sizes.update({"/d0": 300, "/d1": 250})
    assert evidence.poll(50.01, sizes.__getitem__) is not None  # still growing
    assert evidence.poll(50.02, sizes.__getitem__) is None  # settled
    stacks = {("/d0", 0): IN_ALL_REDUCE, ("/d1", 10): IN_SLEEP}
    record = evidence.record(lambda path, offset: stacks[(path, offset)])
    assert [(e.rank, e.in_collective, e.stack_dump_file) for e in record.ranks] == \
        [(0, True, "/d0"), (1, False, "/d1"), (2, None, None)]


def test_live_ranks_evidence_gives_up_on_a_rank_that_never_dumps_at_its_deadline():
    evidence = LiveRanksEvidence()
    evidence.add(ev(0), "/d0", DumpWait(offset=0, deadline=50.5))
    assert evidence.poll(50.4, lambda _path: 0) is not None
    assert evidence.poll(50.5, lambda _path: 0) is None
    assert evidence.record(lambda _path, _offset: "").ranks[0].in_collective is None
