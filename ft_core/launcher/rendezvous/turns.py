"""The order of a restart's writes to torch's rendezvous state: one node at a time, by the last round's rank.

Torch's rendezvous state is one key written by compare-and-set. In a restart
every node leaves the completed round (and adds itself to the wait list), then
joins the next one: about 3N writes, which the compare-and-set admits one at a
time. Nodes that write at once are refused and retry on the state the refusal
returned, so k nodes together spend up to k(k-1)/2 refused writes; a restart
of N nodes arriving together spent O(N^2) of them (441 at 32 nodes on c10d).

Here each node of the completed round takes its *turn*: while it leaves
(:attr:`Stage.LEAVING`) and while it joins the next round
(:attr:`Stage.JOINING`), a node whose rank in that completed round is not the
lowest of the nodes still to write waits until the node before it passes it
the turn, i.e. writes a key addressed to it (its *inbox* for that phase); a
node done with its writes of the stage passes the turn to the next node still
to write. So the writes of a restart follow one another without refusals, and
each costs O(1) extra operations (a wait, a hand-over, a read of the state
after the wait): linear in N.

What this must not change (docs/scale.md):

* a node never waits for a turn without a deadline: after the wake-up's
  timeout (torch's one-second poll) without progress (no node ahead of it
  wrote), it writes as torch would. A lost node, a node that does not order
  its writes (``wake_on_change=0``), or a node late to learn of the restart
  costs at most that second;
* only the nodes of the completed round are ordered: a spare, a new node
  (scale-up) and the first rendezvous are torch's round, unchanged.
"""

from __future__ import annotations

import enum
from typing import Any, Optional

__all__ = ["RestartOrder", "Stage", "inbox_name"]


class Stage(enum.Enum):
    """Where a restart is, for a node of the last completed round."""

    #: The round completed (phase 2R + 1): every node removes itself from it and enters the wait list.
    LEAVING = "leaving"
    #: The next round opened (phase 2R + 2): every node of the wait list joins it.
    JOINING = "joining"


def inbox_name(node: Any) -> str:
    """The key name of ``node``'s inbox (torch's ``_NodeDesc``: address, process id and local id)."""
    return f"{node.addr}_{node.pid}_{node.local_id}".replace("/", "_")


class RestartOrder:
    """The ranks of the last completed round this node took part in, and whose turn it is in a restart."""

    def __init__(self, node: Any) -> None:
        self.node = node
        self._ranks: dict[Any, int] = {}
        self._round = -1

    def observe(self, state: Any) -> None:
        """Learn the ranks from a state read or written (torch's ``_RendezvousState``)."""
        if state.complete and self.node in state.participants:
            if int(state.round) != self._round:
                self._ranks, self._round = {}, int(state.round)
            # The ranks of a round never change once it completed; the nodes that left it keep theirs here.
            self._ranks.update(state.participants)

    def stage(self, state: Any) -> Optional[Stage]:
        """The stage ``state`` is in for this node, or None when its writes are not ordered (torch's round)."""
        if self.node not in self._ranks:
            return None
        if int(state.round) == self._round and state.complete:
            return Stage.LEAVING
        if int(state.round) == self._round + 1 and not state.complete:
            return Stage.JOINING
        return None

    def ahead(self, state: Any) -> frozenset[Any]:
        """The nodes ranked before this one that still have to write in ``state``'s stage (empty: its turn)."""
        to_write = self._to_write(state)
        if self.node not in to_write:  # nothing of its own left to write in this stage (a keep-alive, say)
            return frozenset()
        mine = self._ranks[self.node]
        return frozenset(node for node in to_write if -1 < self._ranks.get(node, -1) < mine)

    def successor(self, state: Any) -> Optional[Any]:
        """The next node (by rank) that still has to write in ``state``'s stage: the one to pass the turn to."""
        mine = self._ranks.get(self.node, -1)
        after = [node for node in self._to_write(state) if self._ranks.get(node, -1) > mine]
        return min(after, key=self._ranks.__getitem__) if after else None

    def _to_write(self, state: Any) -> list[Any]:
        stage = self.stage(state)
        if stage is Stage.LEAVING:
            return list(state.participants)  # not left yet
        if stage is Stage.JOINING:
            return list(state.wait_list)  # not joined yet (the node that opened the round never was in it)
        return []
