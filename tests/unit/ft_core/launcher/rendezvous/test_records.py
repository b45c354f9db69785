"""The launcher's cheap naming of torch's rendezvous records names them as torch does."""

from __future__ import annotations

import inspect
import uuid

import pytest
from helpers import free_port
from torch.distributed.elastic.rendezvous import RendezvousParameters, registry
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as torch_rdzv

from ft_core.launcher.rendezvous.records import method_name, use_cheap_method_names


def inspect_method_name(depth: int = 2) -> str:
    """What torch's ``get_method_name`` computes, written out here as the reference."""
    stack = inspect.stack()
    return stack[depth].function if len(stack) > depth else "no_method_name"


def record(namer):
    return namer()  # like torch's _record: the name wanted is its caller's


def the_callers_name(namer):
    return record(namer)


def test_method_name_is_the_name_inspect_finds():
    assert the_callers_name(method_name) == the_callers_name(inspect_method_name) == "the_callers_name"
    assert method_name(0) == "method_name"
    assert method_name(10_000) == "no_method_name"


def one_rendezvous_record_names(monkeypatch) -> list[str]:
    """Run a real one-node c10d rendezvous and return the names of the events torch recorded."""
    names: list[str] = []
    monkeypatch.setattr(torch_rdzv, "construct_and_record_rdzv_event",
                        lambda **event: names.append(event["name"]))
    handler = registry.get_rendezvous_handler(RendezvousParameters(
        backend="c10d", endpoint=f"127.0.0.1:{free_port()}", run_id=uuid.uuid4().hex, min_nodes=1, max_nodes=1))
    try:
        assert handler.next_rendezvous().world_size == 1
    finally:
        handler.shutdown()
    return names


@pytest.mark.timeout(60)
def test_a_real_rendezvous_records_the_same_names(monkeypatch):
    monkeypatch.setattr(torch_rdzv, "get_method_name", torch_rdzv.get_method_name)  # restored after the test
    with_inspect = one_rendezvous_record_names(monkeypatch)
    use_cheap_method_names()
    assert torch_rdzv.get_method_name is method_name
    assert one_rendezvous_record_names(monkeypatch) == with_inspect
    assert "DynamicRendezvousHandler.next_rendezvous" in with_inspect
