"""One matrix cell: a framework on N GPUs for E epochs with seed S, plus the trainer options it runs.

Defined here because the harness (matrix, bench) and the results store (results, report) both key
on it; the store files a run under `cell.key` and skips it when `cell.config_hash` is recorded.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

FRAMEWORKS = ("ddp", "spark", "determined")


@dataclass(frozen=True, order=True)
class Cell:
    framework: str
    gpus: int
    epochs: int
    seed: int
    profile: str = field(default="", compare=False)
    # Trainer options shared by the profile (model, dataset, hyperparameters), as sorted pairs so a Cell hashes.
    trainer_options: tuple[tuple[str, Any], ...] = field(default=(), compare=False)

    @property
    def key(self) -> str:
        """Stable, filesystem- and unit-name-safe id, e.g. ddp-g2-e20-s1."""
        return f"{self.framework}-g{self.gpus}-e{self.epochs}-s{self.seed}"

    @property
    def trainer_config(self) -> dict[str, Any]:
        """The trainer options of this run (TrainConfig keys), without per-node paths."""
        return {**dict(self.trainer_options), "epochs": self.epochs, "seed": self.seed,
                "framework": self.framework}

    @property
    def config_hash(self) -> str:
        """Hash of everything that changes the run's outcome: same hash = same experiment, skip it."""
        identity = {"framework": self.framework, "gpus": self.gpus, **self.trainer_config}
        return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def as_dict(self) -> dict[str, Any]:
        return {"framework": self.framework, "gpus": self.gpus, "epochs": self.epochs, "seed": self.seed,
                "profile": self.profile, "trainer": dict(self.trainer_options), "key": self.key,
                "config_hash": self.config_hash}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Cell:
        return cls(framework=data["framework"], gpus=int(data["gpus"]), epochs=int(data["epochs"]),
                   seed=int(data["seed"]), profile=data.get("profile", ""),
                   trainer_options=tuple(sorted((data.get("trainer") or {}).items())))
