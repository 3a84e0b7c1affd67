"""How one cell starts: which nodes and GPUs it gets (placement, in common) and what runs where
(one module per framework: ddp, spark, determined, ray, slurm). bench calls `build` and reads the Launch.
"""

from __future__ import annotations

from dtlab.cell import Cell
from dtlab.errors import DtlabError
from dtlab.inventory import Cluster
from dtlab.launch import ddp, determined, ray, slurm, spark
from dtlab.launch.common import (
    CellPaths,
    Launch,
    Placement,
    place,
    prepare_command,
    shared_checkpoint_command,
)

BUILDERS = {"ddp": ddp.build, "spark": spark.build, "determined": determined.build,
            "ray": ray.build, "slurm": slurm.build}


def build(cluster: Cluster, cell: Cell, attempt: int, timeout_s: int) -> Launch:
    """Dispatch to the cell's framework."""
    if cell.framework not in BUILDERS:
        raise DtlabError(f"cell {cell.key}: no launcher for framework {cell.framework!r}")
    return BUILDERS[cell.framework](cluster, cell, attempt, timeout_s)


__all__ = ["BUILDERS", "CellPaths", "Launch", "Placement", "build", "place", "prepare_command",
           "shared_checkpoint_command"]
