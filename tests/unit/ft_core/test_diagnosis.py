"""The culprit ranking rule (ft_core.diagnosis)."""

from __future__ import annotations

from ft_core.diagnosis import STACKS_BLIND, STOPPED_FIRST_MARGIN, diagnose, stack_in_collective
from ft_core.events import RankEvidence

IN_ALL_REDUCE = """Current thread 0x00007f0000000001 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2501 in all_reduce
  File "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/job/train.py", line 40 in main
"""
IN_SLEEP = """Thread 0x00007f0000000002 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/timer.py", line 9 in watch
  File "/usr/lib/python3.11/threading.py", line 975 in run

Thread 0x00007f0000000001 (most recent call first):
  File "/job/train.py", line 12 in inject
  File "/job/train.py", line 40 in main
"""


def ev(rank, **fields):
    fields.setdefault("last_activity", 100.0)  # it sent signs of life (most ranks do)
    return RankEvidence(rank=rank, pid=100 + rank, node="h:1", **fields)


def ranks(verdict):
    return [e.rank for e in verdict.culprits], [e.rank for e in verdict.waiting]


def test_stacks_name_the_rank_outside_the_collective_even_when_the_waiter_expired_first():
    verdict = diagnose([ev(0, iteration=25, section="step", hung=True, stalled_for=3.0, in_collective=True),
                        ev(1, iteration=25, section="step", stalled_for=2.9, in_collective=False)])
    assert ranks(verdict) == ([1], [0])
    # Rank 1's own deadline had not passed: it is named "silent", not "hung".
    assert verdict.headline() == ("rank 1 (node h:1, pid 101) silent in section step at iteration 25 for 2.9 s; "
                                  "rank 0 was waiting for it")
    event = verdict.to_event(cycle=4, decided_by="h:1")
    assert (event.culprits, event.waiting, event.culprit_nodes, event.cycle) == ([1], [0], ["h:1"], 4)


def test_the_lowest_iteration_is_the_culprit():
    verdict = diagnose([ev(0, iteration=26), ev(1, iteration=25), ev(2, iteration=26)])
    assert ranks(verdict) == ([1], [0, 2])
    assert "lowest iteration 25" in verdict.evidence


def test_ties_at_the_lowest_iteration_name_every_tied_rank():
    assert ranks(diagnose([ev(0, iteration=7), ev(1, iteration=5), ev(2, iteration=5)])) == ([1, 2], [0])


def test_all_ranks_hung_at_the_same_iteration_are_all_culprits():
    verdict = diagnose([ev(r, iteration=9, hung=True, stalled_for=3.0) for r in range(3)])
    assert ranks(verdict) == ([0, 1, 2], [])
    assert verdict.headline().endswith("; no rank was only waiting")
    assert "nothing tells the ranks apart" in verdict.evidence


def test_a_rank_without_iteration_info_stays_a_suspect_until_its_stack_clears_it():
    assert ranks(diagnose([ev(0, iteration=3), ev(1), ev(2, iteration=4)])) == ([0, 1], [2])
    cleared = diagnose([ev(0, iteration=3, in_collective=False), ev(1, in_collective=True)])
    assert ranks(cleared) == ([0], [1])
    assert "(no iteration reported)" in diagnose([ev(1)]).headline()


def test_a_stopped_rank_is_the_culprit_whatever_its_stack_shows():
    # Megatron-LM's FT_SIM_FAULT_DESC "rank_hung" SIGSTOPs a rank; the monitor continues it to take
    # its stack, which then shows an ordinary step, while its peer errored out of the collective.
    verdict = diagnose([ev(0, in_collective=False), ev(1, in_collective=False, stopped=True)])
    assert ranks(verdict) == ([1], [0])
    assert "rank 1 stopped by a signal" in verdict.evidence
    assert ranks(diagnose([ev(0, stopped=True), ev(1, stopped=True)])) == ([0, 1], [])


def test_a_rank_without_a_stack_is_the_suspect_when_its_peers_wait_in_a_collective():
    # A SIGSTOPped rank (Megatron-LM's FT_SIM_FAULT_DESC "rank_hung") cannot dump its stack; the
    # peer that waits for it in the all-reduce can. No iteration is known to either.
    verdict = diagnose([ev(0, in_collective=True), ev(1)])
    assert ranks(verdict) == ([1], [0])
    assert "without a stack (rank 1)" in verdict.evidence


def test_collective_stacks_tell_nothing_when_every_rank_is_in_one():
    assert ranks(diagnose([ev(0, iteration=5, in_collective=True), ev(1, iteration=4, in_collective=True)])) \
        == ([1], [0])


def test_who_stopped_first_decides_only_without_stacks_and_beyond_the_margin():
    late = 100.0 + STOPPED_FIRST_MARGIN + 0.5
    assert ranks(diagnose([ev(0, iteration=5, last_activity=late), ev(1, iteration=5, last_activity=100.0)])) \
        == ([1], [0])
    # Within the margin: ranks in lock-step, a tie.
    assert ranks(diagnose([ev(0, iteration=5, last_activity=100.5), ev(1, iteration=5, last_activity=100.0)])) \
        == ([0, 1], [])
    # A waiter often stopped first (the culprit heartbeated, then hung): its stack wins over timing.
    assert ranks(diagnose([ev(0, iteration=5, last_activity=100.0, in_collective=True),
                           ev(1, iteration=5, last_activity=late, in_collective=False)])) == ([1], [0])


def test_a_hang_record_wins_over_the_live_evidence_of_the_same_rank():
    verdict = diagnose([ev(1, iteration=2, in_collective=True), ev(1, iteration=2, hung=True, in_collective=False),
                        ev(0, iteration=2, in_collective=True)])
    assert ranks(verdict) == ([1], [0]) and verdict.culprits[0].hung


# -- NCCL-shaped evidence: waiters block at their next host sync, not in a torch.distributed frame ------
IN_ITEM = """Current thread 0x00007f0000000001 (most recent call first):
  File "/job/train.py", line 52 in train_step
  File "/job/train.py", line 70 in main
"""


def test_nccl_stacks_tie_and_the_rank_that_stopped_first_is_named():
    # Rank 1 hangs in its data loader at 100.0; rank 0's all-reduce returns at once (NCCL) and it
    # blocks in .item() at 101.8, expires first and is recorded as hung. Both stacks are "elsewhere":
    # they tie, and who stopped first breaks the tie. The headline says stacks cannot show waiting.
    verdict = diagnose([
        ev(0, iteration=25, hung=True, stalled_for=3.0, timeout=3.0, last_activity=101.8,
           in_collective=stack_in_collective(IN_ITEM)),
        ev(1, iteration=25, stalled_for=4.8, timeout=3.0, last_activity=100.0,
           in_collective=stack_in_collective(IN_SLEEP))])
    assert ranks(verdict) == ([1], [0])
    assert "stopped first" in verdict.evidence
    assert verdict.headline().endswith(STACKS_BLIND)
    assert "rank 1 (node h:1, pid 101) silent outside any section" in verdict.headline()  # it did not expire


def test_a_rank_that_never_connected_is_the_first_suspect():
    # World size 3, evidence from ranks 0 and 1 only: rank 2 never reached its monitor; the others
    # waited for it in init_process_group or the first collective.
    verdict = diagnose([ev(0, hung=True, stalled_for=90.0, timeout=90.0), ev(1, hung=True, stalled_for=90.0,
                        timeout=90.0)], world_size=3)
    assert ranks(verdict) == ([2], [0, 1])
    assert "rank 2 never connected" in verdict.evidence
    assert verdict.headline().startswith("rank 2 never connected to its node's monitor; ranks 0, 1 were waiting")
    # Connected but no sign of life ever (stuck in its imports): the same.
    silent = diagnose([ev(0, hung=True, stalled_for=90.0), ev(1, last_activity=None)], world_size=2)
    assert ranks(silent) == ([1], [0]) and "never sent a sign of life" in silent.headline()
    # Without the world size nothing is invented (another node's evidence may simply be missing).
    assert ranks(diagnose([ev(0, hung=True), ev(1, hung=True)])) == ([0, 1], [])


def test_a_rank_alive_within_its_timeout_is_not_named_while_another_suspect_remains():
    # NCCL-shaped stacks (neither in a collective). Rank 1 reported a lower iteration but was active
    # 0.0 s before: it is not the culprit; rank 0, past its timeout, is.
    verdict = diagnose([ev(0, iteration=9, hung=True, stalled_for=3.0, timeout=3.0, in_collective=False),
                        ev(1, iteration=8, stalled_for=0.0, timeout=3.0, in_collective=False)])
    assert ranks(verdict) == ([0], [1])
    assert "rank 1 alive within their timeouts" in verdict.evidence
    # The real hang is still named: silent past its timeout, the rank at the lowest iteration is the culprit.
    real = diagnose([ev(0, iteration=9, hung=True, stalled_for=3.0, timeout=3.0, in_collective=False),
                     ev(1, iteration=8, stalled_for=3.5, timeout=3.0, in_collective=False)])
    assert ranks(real) == ([1], [0])
    # Ranks in lock-step expire within the margin: the one that expired first may be the waiter.
    lockstep = diagnose([ev(0, iteration=9, hung=True, stalled_for=3.0, timeout=3.0, in_collective=True),
                         ev(1, iteration=9, stalled_for=2.95, timeout=3.0, in_collective=False)])
    assert ranks(lockstep) == ([1], [0])


def test_no_evidence_no_verdict():
    assert diagnose([]) is None


def test_stack_classification():
    assert stack_in_collective(IN_ALL_REDUCE) is True
    assert stack_in_collective(IN_SLEEP) is False  # the main thread (listed last) is outside torch.distributed
    assert stack_in_collective("") is None and stack_in_collective("garbage") is None
    # DDP: the gradient all-reduce runs inside backward, from the autograd engine's C++ hooks.
    in_backward = ('Current thread 0x00007f (most recent call first):\n'
                   '  File "/venv/lib/python3.11/site-packages/torch/autograd/graph.py", line 979 in _engine_run_backward\n'
                   '  File "/venv/lib/python3.11/site-packages/torch/autograd/__init__.py", line 395 in backward\n'
                   '  File "/work/train.py", line 12 in training_step\n')
    assert stack_in_collective(in_backward) is True
