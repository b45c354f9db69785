"""A restart keeps its nodes: the last round's members rejoin torch's next round before a newcomer takes a place.

When a cycle ends, every node of torch's dynamic rendezvous leaves the round and joins
the next one, and so does a hot spare waiting beside them: whoever joins first gets a
place. A spare that wins the race takes the place of a healthy node, which becomes the
spare; the ranks are then handed out anew (torch sorts the participants), so after a
mere crash every rank may resume on another node, where none of its in-memory
snapshots is (``benchmarks/goodput.py`` saw most restarts of a 4-node job with a spare
resume from disk for this reason).

This module keeps torch's rendezvous and rules, and adds one to its join operation: a
node that was not a participant of the last complete round it saw (a spare, a node
scaling the job up) waits while the members of that round who were alive then would
fill the new round without it, for at most :data:`MEMBERS_FIRST_GRACE` seconds after it
first saw the round open. So:

* a rank crashed or hung, every node alive: the members rejoin, the round completes
  with them at the job's maximum, and the spare stays a spare; ranks are unchanged;
* a node lost: its keep-alive had stopped (its newest heartbeat this node saw is
  older than two keep-alive intervals; torch drops it after three), or a node that
  removed it from the round for its stopped liveness beat marked it lost
  (:data:`~.liveness.LOST_MARK`, read once when the spare would wait for it), so it is
  not waited for: the spare joins at once and takes the free place;
* a node that left the job (excluded by the fault policy) is not in the state any more:
  it is waited for only :data:`ABSENT_GRACE` seconds (the member whose leaving opened
  the round is absent that long at most before it joins);
* a member that does not come back within the grace (stuck, or lost without this node
  having seen its heartbeat age) is replaced, as by torch; no new way to deadlock.

Nodes that were members never wait. A newcomer that saw no complete round (it arrived
while the round was open) joins as torch would. ``--rdzv-conf members_first=0`` turns
the rule off.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import logging
import time
from collections.abc import Callable
from typing import Any, Optional

from ft_core.launcher.rendezvous.conf import MEMBERS_FIRST_CONF_KEY, switched_on

__all__ = ["ABSENT_GRACE", "ALIVE_INTERVALS", "DEFERRED_LINE", "MEMBERS_FIRST_GRACE", "LastRound", "MembersFirst",
           "absent_members", "install_members_first", "newcomer_waits"]

log = logging.getLogger("ft_core.launcher")

#: How long a newcomer lets the last round's members rejoin, from when it first saw the new round open. The
#: members are woken by the round's opening and join within milliseconds on a healthy node; a member later than
#: this is replaced, as torch would replace it.
MEMBERS_FIRST_GRACE = 3.0
#: How long a member the state does not show (it left the last round and is not waiting for the next) is still
#: waited for: the member whose leaving opened the round joins a few store operations later.
ABSENT_GRACE = 0.5
#: A member whose last heartbeat was older than this many keep-alive intervals is not waited for (it stopped
#: keeping alive; torch drops it after ``keep_alive_max_attempt`` intervals, 3 by default).
ALIVE_INTERVALS = 2


_NEVER = datetime.datetime.min.replace(tzinfo=datetime.timezone.utc)


@dataclasses.dataclass
class LastRound:
    """What a node saw of the last complete round it was not a member of, and when the next one opened.

    ``round``: that round's number (-1: none seen); ``heartbeats``: the newest keep-alive seen of
    each of its participants (also after they left it: a member waiting for the next round keeps
    alive); ``opened_at``: this node's monotonic clock when it first saw round ``round + 1``;
    ``member_of``: the last complete round this node was a participant of (-1: none).
    """

    round: int = -1
    heartbeats: dict[Any, datetime.datetime] = dataclasses.field(default_factory=dict)
    opened_at: Optional[float] = None
    member_of: int = -1

    def observe(self, state: Any, node: Any, monotonic: float) -> None:
        """Update from a state this node read (torch's ``_RendezvousState``)."""
        if state.complete and node in state.participants:  # a member: nothing to wait for
            self.round, self.heartbeats, self.opened_at, self.member_of = -1, {}, None, state.round
            return
        if state.round == self.member_of or (not state.complete and state.round == self.member_of + 1):
            # The round this node left to restart, or the next one still open: a member rejoining, not a newcomer
            # (seen without itself, the rest of its round could fill the next one and hold it back).
            return
        if state.complete and state.round != self.round:
            self.round, self.heartbeats, self.opened_at = state.round, {}, None
        if state.complete:
            for member in state.participants:
                self.heartbeats.setdefault(member, _NEVER)
        for member, seen in self.heartbeats.items():
            self.heartbeats[member] = max(seen, state.last_heartbeats.get(member, _NEVER))
        if not state.complete and state.round == self.round + 1 and self.opened_at is None:
            self.opened_at = monotonic

    def members(self, now: datetime.datetime, keep_alive: datetime.timedelta) -> frozenset[Any]:
        """The round's participants whose newest keep-alive is within :data:`ALIVE_INTERVALS` of ``now``."""
        recent = now - ALIVE_INTERVALS * keep_alive
        return frozenset(member for member, seen in self.heartbeats.items() if seen > recent)


def newcomer_waits(state: Any, node: Any, last: LastRound, max_nodes: int, now: datetime.datetime,
                   keep_alive: datetime.timedelta, monotonic: float, grace: float = MEMBERS_FIRST_GRACE,
                   lost: frozenset[Any] = frozenset()) -> bool:
    """Whether ``node``, about to join the open round of ``state``, lets the last round's members in first.

    The members waited for are the live ones of ``last`` (:meth:`LastRound.members`) that the
    state still shows (in the round, waiting for it, or keeping alive), or, for
    :data:`ABSENT_GRACE` after ``node`` first saw the round open, that it does not show: the
    member whose leaving opened the round joins right after, while a member that left the job
    (an excluded node) never comes back; never those of ``lost`` (marked lost by the node that
    removed them). True while those not yet joined would, with those that have, fill the round
    to ``max_nodes`` without ``node``, until ``grace`` has passed.
    """
    if state.complete or last.round != state.round - 1 or last.opened_at is None:
        return False
    waited = monotonic - last.opened_at
    present = _shown(state)
    members = {m for m in last.members(now, keep_alive) if m not in lost and (m in present or waited < ABSENT_GRACE)}
    joined = set(state.participants)
    return node not in members and bool(members - joined) and len(members | joined) >= max_nodes and waited < grace


def absent_members(state: Any, last: LastRound, now: datetime.datetime, keep_alive: datetime.timedelta
                   ) -> frozenset[Any]:
    """The live members of ``last`` that ``state`` does not show (neither in the round, waiting, nor keeping alive)."""
    return frozenset(last.members(now, keep_alive) - _shown(state))


def _shown(state: Any) -> set[Any]:
    """The nodes ``state`` shows: in the round, waiting for it, or keeping alive."""
    return set(state.participants) | set(state.wait_list) | set(state.last_heartbeats)


#: Logged once per round a newcomer waits (``%`` fields: the round, the grace).
DEFERRED_LINE = "rendezvous round %d: the last round's members rejoin first; this node waits (at most %g s)"


class MembersFirst:
    """The rule on one handler: wraps each join operation its executor runs (see the module docstring)."""

    def __init__(self, executor: Any, grace: float = MEMBERS_FIRST_GRACE) -> None:
        self._run: Callable[..., None] = executor.run
        self.grace = grace
        #: Which of the given members another node marked lost (:meth:`.liveness.LostMembers.marked_lost`); None:
        #: no liveness rule, an absent member is waited for :data:`ABSENT_GRACE`.
        self.lost_of: Optional[Callable[[frozenset[Any]], frozenset[Any]]] = None
        self.last = LastRound()
        #: Join operations this rule held back (one per state read that found members still to come).
        self.deferrals = 0
        self._told_round = -1
        executor.run = self.run

    def run(self, state_handler: Callable[[Any, float], Any], deadline: float,
            update_deadline: Optional[Callable[[datetime.timedelta], float]] = None) -> None:
        """Torch's ``_RendezvousOpExecutor.run``, with a join operation wrapped by :meth:`join`."""
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousJoinOp

        if isinstance(state_handler, _RendezvousJoinOp):
            state_handler = functools.partial(self.join, state_handler)
        self._run(state_handler, deadline, update_deadline)

    def join(self, op: Callable[[Any, float], Any], ctx: Any, deadline: float) -> Any:
        """Torch's join decision, held back to a wait while the last round's members are still to come."""
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _Action, _should_keep_alive

        action = op(ctx, deadline)
        monotonic = time.monotonic()
        self.last.observe(ctx.state, ctx.node, monotonic)
        if action == _Action.ADD_TO_PARTICIPANTS and self._waits(ctx, monotonic):
            if self._told_round != ctx.state.round:
                self._told_round = ctx.state.round
                log.info(DEFERRED_LINE, ctx.state.round, self.grace)
            self.deferrals += 1
            return _Action.KEEP_ALIVE if _should_keep_alive(ctx) else _Action.SYNC
        return action

    def _waits(self, ctx: Any, monotonic: float) -> bool:
        """:func:`newcomer_waits`; when it holds and members are absent, again without those marked lost (one read)."""
        now, keep_alive = datetime.datetime.now(datetime.timezone.utc), ctx.settings.keep_alive_interval
        args = (ctx.state, ctx.node, self.last, ctx.settings.max_nodes, now, keep_alive, monotonic, self.grace)
        if not newcomer_waits(*args):
            return False
        absent = absent_members(ctx.state, self.last, now, keep_alive)
        if not absent or self.lost_of is None:
            return True
        lost = self.lost_of(absent)
        return not lost or newcomer_waits(*args, lost=lost)


def install_members_first(handler: Any, rdzv_configs: dict[str, Any]) -> Optional[MembersFirst]:
    """Give a dynamic rendezvous handler the rule; None when ``--rdzv-conf members_first=0`` or another handler."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    if not switched_on(rdzv_configs, MEMBERS_FIRST_CONF_KEY):
        return None
    if not isinstance(handler, DynamicRendezvousHandler):
        return None
    return MembersFirst(handler._op_executor)
