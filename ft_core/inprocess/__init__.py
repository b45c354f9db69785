"""In-process restart: restart the training *function* inside the surviving processes.

See ``Wrapper`` for an example, and the documentation page "In-process restart" (``docs/inprocess.md``) for the design and
the timeout hierarchy.
"""

from .abort import AbortTorchDistributed
from .call_wrapper import CallWrapper
from .compose import Compose
from .exceptions import HealthCheckError, RankShouldRestart, RestartAbort, RestartError
from .health_check import FaultCounter
from .hook_context import RankAssignmentCtx, State
from .initialize import RetryController
from .rank_assignment import ActiveWorldSize, FillGaps, ShiftRanks
from .store_factory import StoreFactory, TCPStoreFactory
from .wrapper import Wrapper

__all__ = [
    "AbortTorchDistributed",
    "ActiveWorldSize",
    "CallWrapper",
    "Compose",
    "FaultCounter",
    "FillGaps",
    "HealthCheckError",
    "RankAssignmentCtx",
    "RankShouldRestart",
    "RestartAbort",
    "RestartError",
    "RetryController",
    "ShiftRanks",
    "State",
    "StoreFactory",
    "TCPStoreFactory",
    "Wrapper",
]
