"""PyTorch Lightning integration: ``Trainer(callbacks=[FaultToleranceCallback()])``.

Works with ``lightning.pytorch``, or with ``pytorch_lightning`` when only that is installed.
"""

from ft_integrations.fault_injection import (
    FAULT_KINDS,
    FaultKind,
    SimulatedFault,
    SimulatedFaultError,
)
from ft_integrations.lightning.callback import FaultToleranceCallback, StandalonePolicy
from ft_integrations.lightning.checkpoint_io import FaultToleranceCheckpointIO
from ft_integrations.session import MonitoringMode

__all__ = [
    "FAULT_KINDS",
    "FaultKind",
    "FaultToleranceCallback",
    "FaultToleranceCheckpointIO",
    "MonitoringMode",
    "SimulatedFault",
    "SimulatedFaultError",
    "StandalonePolicy",
]
