"""The node's services the agent is given (:class:`ft_core.launcher.services.Services`)."""

from __future__ import annotations

import dataclasses

from ft_core.launcher.services import Services


def test_pre_warming_and_the_metrics_listener_are_optional_and_off_unless_given():
    # A launcher without pre-warmed workers (--ft-prewarm=off, or a fallback) and without --ft-metrics-port
    # builds its services with neither: the agent must find them None, never a stale factory or listener.
    defaults = {f.name: f.default for f in dataclasses.fields(Services) if f.default is not dataclasses.MISSING}
    assert defaults == {"on_straggler_round": None, "factory": None}
    required = [f.name for f in dataclasses.fields(Services) if f.default is dataclasses.MISSING]
    assert required == ["monitor", "control", "events", "token"]
