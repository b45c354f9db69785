"""Cheap names for torch's rendezvous event records.

Every step of torch's c10d rendezvous (join, keep-alive, mark complete, exit,
...) records an event named after the calling method, and torch finds that
name with ``inspect.stack()``, twice per record. ``inspect.stack()`` reads the
source context of *every* frame on the stack, and for each frame whose file
is not a module's (``<frozen runpy>`` under ``python -m``) it scans all of
``sys.modules``: with torch imported that is thousands of modules per frame.
On a 2-core machine this costs 20-100 ms per rendezvous, paid on every
restart between stopping the old workers and starting the new ones.

:func:`use_cheap_method_names` swaps torch's helper for one that returns the
same name from ``sys._getframe``. The records and logs are unchanged.
"""

from __future__ import annotations

import logging
import sys

__all__ = ["method_name", "use_cheap_method_names"]

log = logging.getLogger("ft_core.launcher")


def method_name(depth: int = 2) -> str:
    """The name of the function ``depth`` frames up (0: this one), as torch's ``get_method_name``."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:  # the stack is shallower than ``depth``
        return "no_method_name"


def use_cheap_method_names() -> None:
    """Make torch's dynamic rendezvous name its event records with :func:`method_name`."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    if not callable(getattr(dynamic_rendezvous, "get_method_name", None)):
        # A torch that no longer has the helper: nothing to speed up, and nothing breaks.
        log.debug("torch's dynamic rendezvous has no get_method_name; rendezvous records left as they are")
        return
    dynamic_rendezvous.get_method_name = method_name
