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
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recipe_lib.schema import register  # noqa: E402

from ft_core.config import (
    FALLBACK_FIELDS,  # noqa: E402
    FaultToleranceConfig,  # noqa: E402
    parse_log_level,  # noqa: E402
)

register()
log = logging.getLogger("recipes.train")


def _fault_tolerance_callback(cfg: DictConfig):
    if cfg.callback is None:
        return None
    ft_block = OmegaConf.to_container(cfg.fault_tolerance, resolve=True)
    # Validate values here (types were checked by the schema): a bad value names its key.
    FaultToleranceConfig.from_mapping(ft_block)
    fault = OmegaConf.to_container(cfg.fault, resolve=True)
    kwargs = OmegaConf.to_container(cfg.callback, resolve=True)
    # Built by hand: hydra's instantiate() reserves the keyword "config" for itself.
    callback_class = get_class(kwargs.pop("_target_"))
    return callback_class(
        **kwargs,
        config={key: ft_block[key] for key in FALLBACK_FIELDS},
        simulated_fault=fault if fault.get("kind") else None,
    )


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(f"[%(asctime)s rank {os.environ.get('RANK', '0')}] %(name)s "
                                           "%(levelname)s: %(message)s"))
    level = parse_log_level(cfg.log_level, "log_level")
    # Our loggers only: Lightning already prints its own messages once.
    for name in ("recipes", "ft_core", "ft_integrations"):
        logging.getLogger(name).addHandler(handler)
        logging.getLogger(name).setLevel(level)
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
    trainer.fit(instantiate(cfg.model), datamodule=instantiate(cfg.data), ckpt_path=ckpt_path)
    if trainer.is_global_zero:
        log.info("training finished at step %d", trainer.global_step)


if __name__ == "__main__":
    main()
