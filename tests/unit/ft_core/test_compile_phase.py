"""CompileWatch: torch.compile's compilations reported as a phase, without ever importing dynamo itself."""

from __future__ import annotations

import sys

import torch

from ft_core.compile_phase import CompileWatch


def test_a_process_that_does_not_compile_never_imports_dynamo(monkeypatch):
    # Dynamo costs every rank over a second and ~70 MB: the watch installs only once torch.compile
    # (which imports it) is in use. Seen from here: a process where dynamo is not imported.
    without = {name: module for name, module in sys.modules.items() if not name.startswith("torch._dynamo")}
    monkeypatch.setattr(sys, "modules", without)
    watch = CompileWatch(lambda: None, lambda: None)
    assert watch.install() is False
    assert "torch._dynamo" not in sys.modules and "torch._dynamo.callback" not in sys.modules


def test_once_dynamo_is_imported_every_compilation_is_reported():
    events: list[str] = []
    watch = CompileWatch(lambda: events.append("start"), lambda: events.append("end"))
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: x * 2 + 1, backend="eager")  # torch.compile imports dynamo
    try:
        assert watch.install() is True
        assert torch.equal(compiled(torch.ones(3)), torch.full((3,), 3.0))
        assert events == ["start", "end"]
        compiled(torch.ones(3))  # cached: no compilation
        assert events == ["start", "end"]
    finally:
        watch.remove()
        torch._dynamo.reset()
    compiled(torch.ones(4))  # removed: a recompile is not reported
    assert events == ["start", "end"]
