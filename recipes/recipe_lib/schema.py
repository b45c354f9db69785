"""Structured-config schema of the recipes: a misspelled or unknown key is an error naming it.

Registered in Hydra's ConfigStore as ``recipe_schema``; ``conf/config.yaml``
lists it first in its defaults, so every group option is merged into these
typed nodes. The ``fault_tolerance`` node has the fields of
``FaultToleranceConfig``: the block ``ft_launcher --ft-cfg-path`` reads is
checked against the same fields.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from ft_core.config import FaultToleranceConfig
from recipe_lib.run_name import default_run_name


@dataclass
class FaultToleranceSchema(FaultToleranceConfig):
    """``FaultToleranceConfig`` as an OmegaConf node.

    OmegaConf checks each field against one type, and ``log_level`` holds an int
    but is written as a name too (``debug``, ``WARN``): the node takes either, and
    ``FaultToleranceConfig.from_mapping`` converts and checks it (``train.py``).
    """

    log_level: Union[int, str] = logging.INFO


@dataclass
class CallbackSchema:
    """Arguments of ``ft_integrations.lightning.FaultToleranceCallback`` settable from YAML."""

    _target_: str = "ft_integrations.lightning.FaultToleranceCallback"
    mode: str = "heartbeats"
    calculate_timeouts: bool = True
    calculate_timeouts_after_steps: int = 100
    state_file: Optional[str] = None
    autoresume: bool = False
    standalone: str = "monitor"


@dataclass
class FaultSchema:
    """A fault to inject for a drill (``kind: null`` = none); see ``SimulatedFault``."""

    kind: Optional[str] = None
    rank: Optional[int] = 0
    step: Optional[int] = None
    delay: Optional[float] = None
    seed: Optional[int] = None
    all_cycles: bool = False


@dataclass
class TrainerSchema:
    _target_: str = "lightning.pytorch.Trainer"
    accelerator: str = "cpu"
    devices: Any = "auto"
    num_nodes: Any = 1
    strategy: str = "auto"
    max_steps: int = 60
    max_epochs: int = -1
    val_check_interval: Any = 20
    check_val_every_n_epoch: Optional[int] = None
    limit_val_batches: Any = 4
    num_sanity_val_steps: int = 0
    log_every_n_steps: int = 10
    enable_progress_bar: bool = False
    enable_model_summary: bool = False
    logger: bool = False
    use_distributed_sampler: bool = True


@dataclass
class CheckpointSchema:
    _target_: str = "lightning.pytorch.callbacks.ModelCheckpoint"
    dirpath: str = "${run_dir}/checkpoints"
    every_n_train_steps: int = 10
    save_last: bool = True
    save_top_k: int = 1
    monitor: Optional[str] = None


@dataclass
class ModelSchema:
    _target_: str = "recipe_lib.model.TinyRegressor"
    in_features: int = 16
    hidden: int = 32
    lr: float = 0.05
    step_delay: float = 0.0


@dataclass
class DataSchema:
    _target_: str = "recipe_lib.data.SyntheticRegressionData"
    num_samples: int = 2048
    in_features: int = "${model.in_features}"  # type: ignore[assignment]
    batch_size: int = 32
    noise: float = 0.1
    seed: int = 0


@dataclass
class RecipeConfig:
    #: Names the run directory; see ``recipe_lib.run_name`` for the default.
    run_name: str = "${ft_run_name:}"
    #: Hydra's output directory of this job: ``outputs/runs/<run_name>``, or
    #: ``outputs/sweeps/<run_name>/<job number>`` in a multirun (``-m``).
    run_dir: str = "${hydra:runtime.output_dir}"
    seed: int = 1234
    #: Resume from ``<run_dir>/checkpoints/last.ckpt`` when it exists (after a restart).
    resume: bool = True
    #: Level of the recipe's loggers: a name in any case (``debug``, ``WARN``) or a number.
    log_level: Union[int, str] = "INFO"
    fault_tolerance: FaultToleranceSchema = field(default_factory=FaultToleranceSchema)
    callback: Optional[CallbackSchema] = None
    fault: FaultSchema = field(default_factory=FaultSchema)
    trainer: TrainerSchema = field(default_factory=TrainerSchema)
    checkpoint: CheckpointSchema = field(default_factory=CheckpointSchema)
    model: ModelSchema = field(default_factory=ModelSchema)
    data: DataSchema = field(default_factory=DataSchema)


def register() -> None:
    """Register the schema and the ``ft_run_name`` resolver (idempotent)."""
    ConfigStore.instance().store(name="recipe_schema", node=RecipeConfig)
    if not OmegaConf.has_resolver("ft_run_name"):
        OmegaConf.register_new_resolver("ft_run_name", default_run_name, use_cache=True)
