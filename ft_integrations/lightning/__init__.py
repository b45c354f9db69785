"""PyTorch Lightning integration: ``Trainer(callbacks=[FaultToleranceCallback()])``.

Works with ``lightning.pytorch``, or with ``pytorch_lightning`` when only that is installed.
"""

from ft_integrations.lightning.callback import FaultToleranceCallback
from ft_integrations.lightning.checkpoint_io import FaultToleranceCheckpointIO
from ft_integrations.lightning.fault_injection import FAULT_KINDS, SimulatedFault, SimulatedFaultError

__all__ = [
    "FAULT_KINDS",
    "FaultToleranceCallback",
    "FaultToleranceCheckpointIO",
    "SimulatedFault",
    "SimulatedFaultError",
]
