"""The launcher's cheap naming of torch's rendezvous records names them as torch does."""

from __future__ import annotations

import inspect

import pytest
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


def one_rendezvous_record_names(monkeypatch, one_rendezvous) -> list[str]:
    """Run a real one-node c10d rendezvous and return the names of the events torch recorded."""
    names: list[str] = []
    monkeypatch.setattr(torch_rdzv, "construct_and_record_rdzv_event",
                        lambda **event: names.append(event["name"]))
    one_rendezvous()
    return names


@pytest.mark.timeout(60)
def test_a_real_rendezvous_records_the_same_names(monkeypatch, one_rendezvous):
    monkeypatch.setattr(torch_rdzv, "get_method_name", torch_rdzv.get_method_name)  # restored after the test
    with_inspect = one_rendezvous_record_names(monkeypatch, one_rendezvous)
    use_cheap_method_names()
    assert torch_rdzv.get_method_name is method_name
    assert one_rendezvous_record_names(monkeypatch, one_rendezvous) == with_inspect
    assert "DynamicRendezvousHandler.next_rendezvous" in with_inspect
