"""``run_in_subprocess`` takes NVRx's signature besides ours; what it refuses, it refuses before starting anything."""

from __future__ import annotations

import inspect

import pytest

from ft_core.config import FaultToleranceConfig
from ft_core.monitor import RankMonitorServer


def test_nvrx_parameters_come_first_in_nvrx_order_with_nvrx_defaults():
    parameters = inspect.signature(RankMonitorServer.run_in_subprocess).parameters
    assert list(parameters)[:5] == ["cfg", "socket_path", "is_restarter_logger", "mp_ctx", "env"]
    assert parameters["is_restarter_logger"].default is False
    assert parameters["ipc_socket_path"].kind is inspect.Parameter.KEYWORD_ONLY
    # Ours after NVRx's are keyword-only: a positional NVRx call never lands in them.
    assert all(parameters[name].kind is inspect.Parameter.KEYWORD_ONLY
               for name in ("token", "events_path", "start_timeout", "wait"))


@pytest.mark.parametrize(("args", "kwargs", "message"), [
    ((), {}, "expected a path"),
    (("/x/m.sock",), {"ipc_socket_path": "/x/m.sock"}, "once"),
    (("/x/m.sock", "yes"), {}, "is_restarter_logger: expected a bool"),
])
def test_a_bad_call_names_the_argument(args, kwargs, message):
    with pytest.raises(TypeError, match=message):
        RankMonitorServer.run_in_subprocess(FaultToleranceConfig(), *args, **kwargs)
