"""The launcher's own ``--rdzv-conf`` keys: read in one place, and checked before the job starts.

Torch hands every ``--rdzv-conf`` key to the rendezvous handler; these three are the
launcher's, each documented in ``docs/launcher.md``:

* ``wake_on_change`` (default on): :mod:`.wake`;
* ``members_first`` (default on): :mod:`.members_first`;
* ``lost_after`` (default :data:`LOST_AFTER` seconds, 0: off): :mod:`.liveness`.

:func:`check_rdzv_conf` runs when the command line is read, so a bad value is a usage error
(exit 2) naming the key, the value and what is allowed, not a failure of a started job.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ft_core.utils.validation import ValidationError, boolean, non_negative_seconds

__all__ = ["BEATS_PER_LOST_AFTER", "LOST_AFTER", "LOST_AFTER_CONF_KEY", "MEMBERS_FIRST_CONF_KEY", "MIN_LOST_AFTER",
           "WAKE_CONF_KEY", "beat_interval", "check_rdzv_conf", "lost_after", "switched_on"]

#: Torch's one-second poll replaced by a wake-up on the change (``0``/``false``: the poll).
WAKE_CONF_KEY = "wake_on_change"
#: The last round's members rejoin before a newcomer (``0``/``false``: torch's first-come order).
MEMBERS_FIRST_CONF_KEY = "members_first"
#: Seconds a member's liveness beat must be read unchanged for it to be removed from a deserted round (0: off).
LOST_AFTER_CONF_KEY = "lost_after"

#: Beats of a launcher within ``lost_after``: a member is judged lost after missing this many in a row. A beat
#: thread of a live launcher is late by that much only when its whole process is stalled.
BEATS_PER_LOST_AFTER = 6
#: Default of ``lost_after``: beats every 0.5 s (one small key written, 2 writes a second per node).
LOST_AFTER = 3.0
#: The shortest ``lost_after`` allowed (beats every 1/3 s: shorter would judge a launcher by delays a busy node's
#: scheduler can cause).
MIN_LOST_AFTER = 2.0


def switched_on(rdzv_configs: Mapping[str, Any], key: str) -> bool:
    """A boolean key (default on); a bad value is a :class:`ValidationError` naming ``--rdzv-conf <key>``."""
    return boolean(f"--rdzv-conf {key}", rdzv_configs.get(key, True), coerce=True)


def lost_after(rdzv_configs: Mapping[str, Any]) -> float:
    """``lost_after`` in seconds (default :data:`LOST_AFTER`; 0: off), at least :data:`MIN_LOST_AFTER` when on."""
    name = f"--rdzv-conf {LOST_AFTER_CONF_KEY}"
    allowed = f"0 (off) or a number of seconds >= {MIN_LOST_AFTER:g}"
    raw = rdzv_configs.get(LOST_AFTER_CONF_KEY, LOST_AFTER)
    try:
        value = non_negative_seconds(name, raw, coerce=True)
    except ValidationError:
        raise ValidationError(name, raw, allowed) from None
    if 0 < value < MIN_LOST_AFTER:
        raise ValidationError(name, raw, allowed)
    return value


def beat_interval(span: float) -> float:
    """Seconds between two liveness beats for ``lost_after=span``: a large job trades detection for fewer writes."""
    return span / BEATS_PER_LOST_AFTER


def check_rdzv_conf(rdzv_configs: Mapping[str, Any]) -> None:
    """Every key of the launcher's own, checked (the first bad one raises)."""
    switched_on(rdzv_configs, WAKE_CONF_KEY)
    switched_on(rdzv_configs, MEMBERS_FIRST_CONF_KEY)
    lost_after(rdzv_configs)
