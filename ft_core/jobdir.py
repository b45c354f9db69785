"""The job directory: the names of its files and the environment variables that point at them.

One home for every path convention shared by the monitor, the client, the
launcher and the standalone monitor, so no other module spells them.
"""

from __future__ import annotations

import os

__all__ = ["TOKEN_ENV", "stack_dump_dir"]

#: The job secret every connection to the monitor or the launcher presents first.
TOKEN_ENV = "FT_MONITOR_TOKEN"
STACKS_DIR_NAME = "stacks"


def stack_dump_dir(socket_path: str) -> str:
    """Where ranks write their faulthandler dumps: ``<socket dir>/stacks`` (a shared convention)."""
    return os.path.join(os.path.dirname(os.path.abspath(socket_path)), STACKS_DIR_NAME)
