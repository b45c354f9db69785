"""torch.compile as its own phase: the rank's client opens ``compile`` while dynamo compiles.

A recompile (the epoch's smaller last batch with ``drop_last=False``, the first eval-mode graph, a
new sequence length) can run far past a learned ``step`` timeout on a healthy rank. TorchDynamo
calls its compile start and end callbacks around every compilation
(``torch._dynamo.callback.callback_handler``, torch >= 2.5; the callbacks take one
``CallbackArgs`` argument since 2.6, none before), so the client opens the
:data:`~ft_core.timeouts.COMPILE_SECTION` section there. The monitor then times the rank by
``compile_timeout`` alone and resumes the other deadlines afterwards, minus the compilation;
a hang inside a compilation is still caught, by ``compile_timeout``.

Installed by :class:`~ft_core.client.RankMonitorClient` when ``compile_timeout`` is set and
torch.compile is in use, i.e. dynamo is imported (``torch.compile`` imports it): at init, and again at
``set_iteration`` and whenever timeouts change, for a model compiled after init. This module never
imports dynamo itself: it costs every rank over a second and ~70 MB, and a rank that does not compile
must not pay for it (nor may the monitor or a torch-free rank import torch).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["CompileWatch"]

log = logging.getLogger("ft_core.compile_phase")


class CompileWatch:
    """Calls ``on_start``/``on_end`` around every dynamo compilation of this process, once installed.

    Nested compilations are reported once (dynamo counts them itself). Errors of the callbacks are
    logged, never raised into torch.compile: monitoring must not break training.
    """

    def __init__(self, on_start: Callable[[], None], on_end: Callable[[], None]) -> None:
        self._on_start, self._on_end = on_start, on_end
        self._handler: Any = None

    def install(self) -> bool:
        """Register with dynamo; False when dynamo is not imported (nothing compiles) or has no compile callbacks."""
        if self._handler is not None:
            return True
        if "torch._dynamo" not in sys.modules:
            return False
        try:
            from torch._dynamo.callback import callback_handler
        except ImportError:  # torch < 2.5, or built without dynamo
            return False
        callback_handler.register_start_callback(self._start)
        callback_handler.register_end_callback(self._end)
        self._handler = callback_handler
        return True

    def remove(self) -> None:
        """Unregister (idempotent)."""
        handler, self._handler = self._handler, None
        if handler is None:
            return
        for remove, callback in ((handler.remove_start_callback, self._start),
                                 (handler.remove_end_callback, self._end)):
            try:
                remove(callback)
            except ValueError:
                pass  # cleared by someone else (torch._dynamo.reset does not, but a test may)

    def _start(self, *_args: Any) -> None:
        _guarded(self._on_start, "start")

    def _end(self, *_args: Any) -> None:
        _guarded(self._on_end, "end")


def _guarded(call: Callable[[], None], what: str) -> None:
    try:
        call()
    except Exception:  # noqa: BLE001 - never break torch.compile
        log.exception("fault tolerance: marking the compile %s failed", what)
