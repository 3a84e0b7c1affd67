"""What every platform's launch shares: which nodes and GPUs a cell gets (placement), where its files go
(CellPaths), what bench runs (Launch), the trainer's config and environment, and the driver-on-the-master
shape that Spark, Ray and Slurm share. Each platform's own launch is in its package in dtlab.platforms.
"""

from __future__ import annotations

from dtlab.launch.common import (
    PREDICT_PATH,
    CellPaths,
    Launch,
    Placement,
    Serving,
    Slot,
    driver_on_master,
    place,
    prepare_command,
    serve_config,
    serve_url,
    serving,
    shared_checkpoint_command,
    trainer_config,
    trainer_env,
    unit,
)

__all__ = ["PREDICT_PATH", "CellPaths", "Launch", "Placement", "Serving", "Slot", "driver_on_master",
           "place", "prepare_command", "serve_config", "serve_url", "serving", "shared_checkpoint_command",
           "trainer_config", "trainer_env", "unit"]
