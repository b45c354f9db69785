"""A ``CheckpointIO`` plugin that reports the start and the end of every checkpoint write.

Lightning lets a plugin own the actual checkpoint write (``strategy.checkpoint_io``);
wrapping it is the public way to time the write itself, whatever strategy or
``ModelCheckpoint`` settings are in use, without patching strategy methods.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol

from typing_extensions import override

from ft_integrations.lightning._pl import CheckpointIO

__all__ = ["CheckpointWriteObserver", "FaultToleranceCheckpointIO"]


class CheckpointWriteObserver(Protocol):
    """What :class:`FaultToleranceCheckpointIO` tells about each write."""

    def on_checkpoint_write_start(self, path: str) -> None: ...

    def on_checkpoint_write_end(self, checkpoint: dict[str, Any], path: str) -> None: ...


class FaultToleranceCheckpointIO(CheckpointIO):
    """Delegates to ``checkpoint_io`` and calls ``observer`` around each ``save_checkpoint``.

    ``on_checkpoint_write_end`` is called only when the write succeeded; a failed
    write propagates its exception unchanged.

    Args:
        checkpoint_io: the plugin that really reads and writes (e.g. ``TorchCheckpointIO``).
        observer: receives ``on_checkpoint_write_start(path)`` and ``on_checkpoint_write_end(checkpoint, path)``.
    """

    def __init__(self, checkpoint_io: CheckpointIO, observer: CheckpointWriteObserver) -> None:
        super().__init__()
        self.checkpoint_io = checkpoint_io
        self.observer = observer

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Optional[Any] = None) -> None:
        self.observer.on_checkpoint_write_start(str(path))
        self.checkpoint_io.save_checkpoint(checkpoint, path, storage_options=storage_options)
        self.observer.on_checkpoint_write_end(checkpoint, str(path))

    @override
    def load_checkpoint(self, path: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return self.checkpoint_io.load_checkpoint(path, *args, **kwargs)

    @override
    def remove_checkpoint(self, path: Any) -> None:
        self.checkpoint_io.remove_checkpoint(path)

    @override
    def teardown(self) -> None:
        self.checkpoint_io.teardown()
