"""One cell of the benchmark matrix and its config hash (what makes two runs the same experiment)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, order=True)
class Cell:
    """One point of the benchmark matrix. ``gpus`` is the GPU count, or the worker count on CPU."""

    framework: str
    gpus: int
    epochs: int
    seed: int
    profile: str = "custom"
    # The trainer settings the cell runs with (hyperparameters, model, dataset); not part of identity.
    trainer_config: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)

    @property
    def key(self) -> str:
        return f"{self.framework}-g{self.gpus}-e{self.epochs}-s{self.seed}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "framework": self.framework,
            "gpus": self.gpus,
            "epochs": self.epochs,
            "seed": self.seed,
            "profile": self.profile,
            "trainer_config": dict(self.trainer_config),
        }


def trainer_options(cell: Cell) -> dict[str, Any]:
    """The trainer options of one cell (TrainConfig keys), without the per-node paths bench adds."""
    return {
        **dict(cell.trainer_config),
        "epochs": cell.epochs,
        "seed": cell.seed,
        "framework": cell.framework,
    }


def config_hash(cell: Cell) -> str:
    """Everything that changes a cell's outcome; the same hash recorded ok means bench.all skips it.

    For generated data or a generated model that includes the generator's and the generated
    tokenizer's versions: the same options with another tokenizer are other tokens. (A hub model's
    tokenizer and a hub dataset are named by their ids; the trainer records the exact tokens'
    fingerprint in each result and checkpoint.)"""
    from trainer.config import (
        GENERATED_DATA_VERSION,
        GENERATED_DATASET,
        GENERATED_MODEL_PREFIX,
        GENERATED_TOKENIZER_VERSION,
    )

    identity = {"gpus": cell.gpus, **trainer_options(cell)}
    if identity.get("dataset") == GENERATED_DATASET:
        identity["generated_data_version"] = GENERATED_DATA_VERSION
    if str(identity.get("model", "")).startswith(GENERATED_MODEL_PREFIX):
        identity["generated_tokenizer_version"] = GENERATED_TOKENIZER_VERSION
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]
