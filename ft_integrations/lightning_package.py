"""Which Lightning distribution the callback is built on, chosen once per process.

``lightning`` (the unified package, ``lightning.pytorch``) and ``pytorch_lightning`` (the
standalone one) ship the same classes under different names, and a ``Trainer`` of one
does not recognise a ``Callback`` of the other. By default the callback subclasses
``lightning.pytorch`` when it is installed, else ``pytorch_lightning``. Importing
``ft_integrations.pytorch_lightning`` chooses the standalone package explicitly, for
environments that have both and train with ``pytorch_lightning.Trainer``.
"""

from __future__ import annotations

import sys
from typing import Optional

from ft_core.utils.strenum import StrEnum


class LightningPackage(StrEnum):
    """The distribution whose ``Callback`` and ``CheckpointIO`` the integration subclasses."""

    LIGHTNING = "lightning"  # lightning.pytorch, lightning.fabric
    PYTORCH_LIGHTNING = "pytorch_lightning"  # pytorch_lightning, lightning_fabric


#: The explicit choice; None until one is made (then the default rule applies).
chosen: Optional[LightningPackage] = None

_BOUND_MODULE = "ft_integrations.lightning._pl"


def choose(package: LightningPackage) -> None:
    """Build the callback on ``package``; an error once it was built on the other one in this process."""
    global chosen
    bound = sys.modules.get(_BOUND_MODULE)
    if bound is not None:
        in_use = LightningPackage.PYTORCH_LIGHTNING if bound.pl.__name__ == "pytorch_lightning" \
            else LightningPackage.LIGHTNING
        if in_use != package:
            raise ImportError(
                f"ft_integrations.lightning is already built on {in_use.value} in this process, "
                f"so it cannot be built on {package.value} too: import the {package.value} variant "
                "before anything imports ft_integrations.lightning (one Lightning package per process)")
    chosen = package
