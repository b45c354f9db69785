"""The JSON-lines event files: the one writer (a record per line, safe beside other writers) and the readers.

The records are the types of :mod:`ft_core.events`. Several processes append to one
file (ranks append their own records to the monitor's); a reader tails a file from
an offset, leaving a partly written last line for its next call.

Example::

    >>> import tempfile, os
    >>> from ft_core.events import Progress
    >>> path = os.path.join(tempfile.mkdtemp(), "events.jsonl")
    >>> with EventWriter(path, node="host:1") as out:
    ...     _ = out.write(Progress(iteration=7, source="rank 0", cycle=0, time=1.0))
    >>> read_records(path)[0]
    [Progress(iteration=7, source='rank 0', cycle=0, time=1.0, node='host:1')]
    >>> read_events(path)[0][0]["event"]
    'progress'

This module must not import torch nor the monitor: ranks, the monitor and the
launcher all import it.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional

import msgspec

from ft_core.events import AnyEvent, Event
from ft_core.jobdir import open_private_log

__all__ = ["EventWriter", "read_events", "read_records"]

log = logging.getLogger("ft_core.events")

_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(AnyEvent)


class EventWriter:
    """Appends records to a JSON-lines file, each as one ``write()`` of a whole line on a fresh line.

    ``O_APPEND`` and no user-space buffer: several writers may share one file (ranks append to the
    monitor's). On a fatal signal the kernel stops a regular-file ``write()`` between pages, so a
    killed writer can leave part of a record; each record starts with a newline of its own
    ("\\n" + record + "\\n", one ``write()``), so that part is one corrupt line readers skip (as
    the blank lines between records): it costs the killed writer's record only, never the next
    record of a writer that had the file open. Created 0600, never through a symlink
    (:func:`~ft_core.jobdir.open_private_log`: records hold paths, arguments and stacks).
    ``node`` is stamped on every record written.
    """

    def __init__(self, path: str, node: Optional[str] = None) -> None:
        self.path = os.path.abspath(path)
        self.node = node
        self._fd: Optional[int] = open_private_log(self.path)

    def write(self, record: Event) -> Event:
        """Append ``record`` (with this writer's ``node``); returns what was written."""
        if self.node is not None and record.node != self.node:
            record = msgspec.structs.replace(record, node=self.node)
        if self._fd is not None:
            line = memoryview(b"\n" + _ENCODER.encode(record) + b"\n")
            while line:  # a regular file takes the whole line unless the disk is full or a fatal signal came
                line = line[os.write(self._fd, line):]
        return record

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _complete_lines(path: str, offset: int) -> tuple[list[bytes], int]:
    """The complete lines appended to ``path`` after byte ``offset``, and the offset after them."""
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1  # a partially written last line waits for the next call
    return [line for line in data[:end].split(b"\n") if line.strip()], offset + end


def read_records(path: str, offset: int = 0) -> tuple[list[Event], int]:
    """The typed records appended to ``path`` after byte ``offset``, and the offset to pass next time.

    A partially written last line is left for the next call; a line that is
    not a known record (corrupt, or from a newer version) is skipped with a
    warning. Unknown extra fields are ignored.
    """
    lines, offset = _complete_lines(path, offset)
    records: list[Event] = []
    for line in lines:
        try:
            records.append(_DECODER.decode(line))
        except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
            log.warning("skipping an unreadable line in %s: %s", path, exc)
    return records, offset


def read_events(path: str, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Like :func:`read_records`, as plain dicts (any event name): for tools, tests and recaps."""
    lines, offset = _complete_lines(path, offset)
    events: list[dict[str, Any]] = []
    for line in lines:
        try:
            value = msgspec.json.decode(line)
        except msgspec.DecodeError:
            log.warning("skipping a corrupt line in %s", path)
            continue
        if isinstance(value, dict):
            events.append(value)
        else:
            log.warning("skipping a line that is not a JSON object in %s", path)
    return events, offset
