"""The Lightning package in use: ``lightning.pytorch``, or ``pytorch_lightning`` when only that is installed."""

from __future__ import annotations

try:
    import lightning.pytorch as pl
    from lightning.fabric.plugins import CheckpointIO
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.utilities.exceptions import MisconfigurationException
    from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
except ImportError:  # the standalone ``pytorch_lightning`` distribution
    import pytorch_lightning as pl  # type: ignore[no-redef]
    from lightning_fabric.plugins import CheckpointIO  # type: ignore[no-redef,assignment]
    from pytorch_lightning.callbacks import Callback  # type: ignore[no-redef,assignment]
    from pytorch_lightning.utilities.exceptions import MisconfigurationException  # type: ignore[no-redef,assignment]
    from pytorch_lightning.utilities.rank_zero import rank_zero_info, rank_zero_warn  # type: ignore[no-redef]

__all__ = ["Callback", "CheckpointIO", "MisconfigurationException", "pl", "rank_zero_info", "rank_zero_warn"]
