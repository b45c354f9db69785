"""Who waits to join torch's dynamic rendezvous (:mod:`ft_core.launcher.rendezvous.membership`).

Torch's scale-up rule is read on a stand-in handler here; the spares and an excluded node's
exit, on real rendezvous, in ``tests/integration/ft_core/launcher/test_multi_node.py``.
"""

from __future__ import annotations

from ft_core.launcher.rendezvous.membership import nodes_could_join


class _Handler:
    def __init__(self, max_nodes: int, waiting: int) -> None:
        self.settings = type("Settings", (), {"max_nodes": max_nodes})()
        self.waiting = waiting

    def num_nodes_waiting(self) -> int:
        return self.waiting


def test_a_node_waiting_where_the_round_has_no_room_is_a_spare_not_a_reason_to_restart():
    assert not nodes_could_join(_Handler(max_nodes=2, waiting=1), nodes=2)  # at the maximum: a spare
    assert nodes_could_join(_Handler(max_nodes=3, waiting=1), nodes=2)  # room: torch's scale-up rule
    assert not nodes_could_join(_Handler(max_nodes=3, waiting=0), nodes=2)
    assert nodes_could_join(type("Etcd", (), {"num_nodes_waiting": lambda self: 1})(), nodes=2)  # no settings
