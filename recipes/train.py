"""Hydra recipe entry point: Lightning training with fault tolerance, composed from ``conf/``.

    ft_launcher --nproc-per-node=2 --max-restarts=3 recipes/train.py fault_tolerance=sections fault=hang_rank1
    python recipes/train.py trainer=cpu_single fault_tolerance=off      # no launcher

The composed ``fault_tolerance:`` block reaches the node monitor in two ways:
``ft_launcher --ft-cfg-path recipes/conf/fault_tolerance/sections.yaml`` (the
launcher reads the same file), or, when the launcher was started without
it, each rank offers it to the monitor as fallback values (launch-time
settings always win).
"""

from __future__ import annotations

import logging
import os
import sys

import hydra
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from hydra.types import RunMode  # noqa: E402
from recipe_lib.run_name import check_run_name  # noqa: E402
from recipe_lib.schema import register  # noqa: E402

from ft_core.config import FaultToleranceConfig, parse_log_level  # noqa: E402
from ft_core.jobdir import FINISHED_FLAG_ENV  # noqa: E402

register()
log = logging.getLogger("recipes.train")


def _fault_tolerance_callback(cfg: DictConfig):
    if cfg.callback is None:
        return None
    # Built (and its values validated: types were checked by the schema) once, here: a bad value names
    # its key. The callback takes this config as it is, and offers its fallback fields to the monitor.
    ft_cfg = FaultToleranceConfig.from_mapping(OmegaConf.to_container(cfg.fault_tolerance, resolve=True))
    fault = OmegaConf.to_container(cfg.fault, resolve=True)
    # The callback is a `_target_` node like the trainer's. instantiate() takes a keyword argument
    # named "config" as its own, and would turn a dataclass into a node: `config` is given afterwards.
    node = OmegaConf.to_container(cfg.callback, resolve=True)
    node["simulated_fault"] = fault if fault.get("kind") else None
    return instantiate(node, _convert_="all", _partial_=True)(config=ft_cfg)


def _setup_logging(log_level: object) -> None:
    """Our loggers only (Lightning prints its own messages once); once per process, not per sweep job."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(f"[%(asctime)s rank {os.environ.get('RANK', '0')}] %(name)s "
                                           "%(levelname)s: %(message)s"))
    level = parse_log_level(log_level, "log_level")
    for name in ("recipes", "ft_core", "ft_integrations"):
        logger = logging.getLogger(name)
        if not logger.handlers:
            logger.addHandler(handler)
        logger.setLevel(level)


def _job_finished_flag(run_dir: str) -> None:
    """In a sweep, one job reaching max_steps is not the sweep finishing: its flag goes into its own run dir.

    Otherwise the first finished job would create ``$FAULT_TOL_FINISHED_FLAG_FILE`` and a
    preempted sweep would look finished to ``ft_launcher`` and the requeue loop.
    """
    if HydraConfig.get().mode == RunMode.MULTIRUN and os.environ.get(FINISHED_FLAG_ENV):
        os.environ[FINISHED_FLAG_ENV] = os.path.join(run_dir, "finished.flag")


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    check_run_name(cfg.run_name)
    _job_finished_flag(cfg.run_dir)
    _setup_logging(cfg.log_level)
    import lightning.pytorch as pl

    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    callbacks = [instantiate(cfg.checkpoint)]
    ft_callback = _fault_tolerance_callback(cfg)
    if ft_callback is not None:
        callbacks.append(ft_callback)
    trainer = instantiate(cfg.trainer, callbacks=callbacks, default_root_dir=cfg.run_dir)
    last = os.path.join(cfg.checkpoint.dirpath, "last.ckpt")
    ckpt_path = last if cfg.resume and os.path.exists(last) else None
    if ckpt_path:
        log.info("resuming from %s", ckpt_path)
    elif int(os.environ.get("RANK", "0")) == 0:
        log.info("run %s: new run in %s", cfg.run_name, cfg.run_dir)
    trainer.fit(instantiate(cfg.model), datamodule=instantiate(cfg.data), ckpt_path=ckpt_path)
    if trainer.is_global_zero:
        log.info("training finished at step %d", trainer.global_step)


if __name__ == "__main__":
    main()
