"""``FaultToleranceCallback`` for the standalone ``pytorch_lightning`` package.

For environments that have both ``lightning`` and ``pytorch_lightning`` installed and
train with ``pytorch_lightning.Trainer`` (``ft_integrations.lightning`` picks
``lightning.pytorch`` whenever it is installed). Import this module first::

    import pytorch_lightning as pl
    from ft_integrations.pytorch_lightning import FaultToleranceCallback

    trainer = pl.Trainer(callbacks=[FaultToleranceCallback(mode="sections")])

The names and behaviour are those of ``ft_integrations.lightning``; one Lightning
package per process (importing both variants is an ``ImportError`` that says so).
"""

from ft_integrations.lightning_package import LightningPackage, choose

choose(LightningPackage.PYTORCH_LIGHTNING)

from ft_integrations import lightning as _lightning  # noqa: E402 (after the choice, which the import reads)
from ft_integrations.lightning import *  # noqa: E402,F403 (the same names, built on pytorch_lightning)

__all__ = list(_lightning.__all__)
