"""Fixtures of the rendezvous unit tests."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from helpers import free_port
from torch.distributed.elastic.rendezvous import RendezvousParameters, registry


@pytest.fixture
def one_rendezvous() -> Callable[[], None]:
    """Runs a real one-node c10d rendezvous (its own store on a free port) each time it is called."""

    def run() -> None:
        handler = registry.get_rendezvous_handler(RendezvousParameters(
            backend="c10d", endpoint=f"127.0.0.1:{free_port()}", run_id=uuid.uuid4().hex, min_nodes=1, max_nodes=1))
        try:
            assert handler.next_rendezvous().world_size == 1
        finally:
            handler.shutdown()

    return run
