"""The Lightning package in use: ``lightning.pytorch``, or ``pytorch_lightning`` when only that is installed."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # type-check against the unified package; the names are the same in both
    import lightning.pytorch as pl
    from lightning.fabric.plugins import CheckpointIO
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.utilities.exceptions import MisconfigurationException
    from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
else:
    try:
        import lightning.pytorch as pl
        from lightning.fabric.plugins import CheckpointIO
        from lightning.pytorch.callbacks import Callback
        from lightning.pytorch.utilities.exceptions import MisconfigurationException
        from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
    except ImportError:  # the standalone ``pytorch_lightning`` distribution
        import pytorch_lightning as pl
        from lightning_fabric.plugins import CheckpointIO
        from pytorch_lightning.callbacks import Callback
        from pytorch_lightning.utilities.exceptions import MisconfigurationException
        from pytorch_lightning.utilities.rank_zero import rank_zero_info, rank_zero_warn

__all__ = ["Callback", "CheckpointIO", "MisconfigurationException", "pl", "rank_zero_info", "rank_zero_warn"]
