"""The Lightning package in use (see :mod:`ft_integrations.lightning_package` for how it is chosen).

``lightning.pytorch`` when installed, else ``pytorch_lightning``; importing
``ft_integrations.pytorch_lightning`` first picks ``pytorch_lightning`` explicitly.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from ft_integrations.lightning_package import LightningPackage, chosen

if TYPE_CHECKING:  # type-check against the unified package; the names are the same in both
    import lightning.pytorch as pl
    from lightning.fabric.plugins import CheckpointIO
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.utilities.exceptions import MisconfigurationException
    from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
elif chosen == LightningPackage.PYTORCH_LIGHTNING or importlib.util.find_spec("lightning") is None:
    import pytorch_lightning as pl  # the standalone distribution
    from lightning_fabric.plugins import CheckpointIO
    from pytorch_lightning.callbacks import Callback
    from pytorch_lightning.utilities.exceptions import MisconfigurationException
    from pytorch_lightning.utilities.rank_zero import rank_zero_info, rank_zero_warn
else:
    import lightning.pytorch as pl
    from lightning.fabric.plugins import CheckpointIO
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.utilities.exceptions import MisconfigurationException
    from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

__all__ = ["Callback", "CheckpointIO", "MisconfigurationException", "pl", "rank_zero_info", "rank_zero_warn"]
