"""One cell of the benchmark matrix and its config hash (what makes two runs the same experiment)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dtlab.errors import DtlabError
from trainer import strategies
from trainer.config import DEFAULT_DATA_PATH
from trainer.search import EARLY_STOPPING

# What a cell runs beyond one training run (scenario C, #54): "" trains once; "search-asha" and
# "search-none" run a search plan's trials with or without ASHA's early stopping (trainer/search.py);
# "serve" serves a trained cell's checkpoint (Cell.trained) and load-tests it (dtlab.loadtest).
SEARCH_TASKS = tuple(f"search-{mode}" for mode in EARLY_STOPPING)
SERVE_TASK = "serve"
TASKS = ("", *SEARCH_TASKS, SERVE_TASK)

# The faults a fault plan can inject (dtlab.faults injects them; docs/faults.md says what each does).
FAULT_KINDS = ("kill", "netdrop", "restart")
# How the cell is to recover: restart (every worker again, from the checkpoint: dtlab's retry or the
# platform's own restart) or elastic (the survivors go on without the lost node: Platform.elastic_recovery).
RECOVERY_MODES = ("restart", "elastic")
# A fault's spec, also the suffix of its cell's key: kill-after1, kill-after1-node2, netdrop-after1-20s,
# and elastic-kill-after1 for recovery elastic.
_FAULT_SPEC = re.compile(r"^(?:(?P<recovery>elastic)-)?(?P<kind>[a-z]+)-after(?P<after>\d+)"
                         r"(?:-(?P<seconds>\d+)s)?(?:-(?P<node>[A-Za-z0-9_.-]+))?$")


@dataclass(frozen=True)
class Fault:
    """What a fault plan does to a cell: `kind` on `node` (None: the last worker running the cell's ranks,
    faults.hit_node) once epoch `after_epoch` is checkpointed; `seconds` is how long a netdrop lasts;
    `recovery` how the cell is to go on (RECOVERY_MODES)."""

    kind: str
    after_epoch: int
    node: str | None = None
    seconds: int | None = None
    recovery: str = RECOVERY_MODES[0]

    @property
    def elastic(self) -> bool:
        return self.recovery == "elastic"

    @property
    def spec(self) -> str:
        seconds = f"-{self.seconds}s" if self.seconds is not None else ""
        mode = "elastic-" if self.elastic else ""
        return f"{mode}{self.kind}-after{self.after_epoch}{seconds}" + (f"-{self.node}" if self.node else "")

    @classmethod
    def parse(cls, spec: str) -> Fault:
        match = _FAULT_SPEC.match(spec)
        if not match or match["kind"] not in FAULT_KINDS:
            raise DtlabError(f"fault {spec!r}: expected KIND-afterK[-Ns][-NODE] with KIND one of "
                             f"{', '.join(FAULT_KINDS)}")
        seconds = int(match["seconds"]) if match["seconds"] else None
        return cls(match["kind"], int(match["after"]), match["node"], seconds,
                   match["recovery"] or RECOVERY_MODES[0])


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
    # A fault plan's Fault.spec ("" for an undisturbed cell): part of the key, the identity and the hash.
    fault: str = ""
    # The parallelism strategy (trainer.strategies.NAMES): part of the identity and the hash; in the key
    # only when not the default, so every key recorded before strategies existed names the same cell.
    strategy: str = strategies.DEFAULT
    # A model other than the profile's (a run's `models:`): part of the identity, the key (model_label)
    # and the hash; "" for the profile's own `trainer: model`, so those cells keep their keys and hashes.
    model: str = ""
    # Where the tokens come from (trainer.config.DATA_PATHS): the DataLoader's own ("loader"), or the
    # platform's own ETL ("platform": Spark's, Ray Data's). Part of the identity, the hash (when not the
    # default) and the key (-etl), so every earlier cell keeps its key and hash.
    data_path: str = DEFAULT_DATA_PATH
    # What the cell runs (TASKS): part of the identity, the key (-search-asha) and the hash when set, so
    # every training cell keeps its key and hash. A search's plan (dtlab.search.SearchSpec.plan: the
    # trials, the budget, ASHA's rungs) is in `task_plan`, hashed, not compared.
    task: str = ""
    task_plan: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        # One statement of the model: a models: cell trains it, whatever trainer_config was given.
        if self.model and self.trainer_config.get("model") != self.model:
            object.__setattr__(self, "trainer_config", {**self.trainer_config, "model": self.model})

    @property
    def key(self) -> str:
        """FRAMEWORK-gN-eE-sS[-STRATEGY][-MODEL][-etl][-TASK][-FAULT]: ddp-g2-e2-s0, ddp-g2-e2-s0-fsdp,
        ddp-g2-e2-s0-fsdp-bert-mini, spark-g2-e2-s0-etl, ray-g2-e4-s0-search-asha,
        ray-g2-e2-s0-serve, ray-g2-e2-s0-zero1-kill-after1."""
        key = f"{self.framework}-g{self.gpus}-e{self.epochs}-s{self.seed}"
        if self.strategy != strategies.DEFAULT:
            key += f"-{self.strategy}"
        if self.model:
            key += f"-{model_label(self.model)}"
        if self.data_path != DEFAULT_DATA_PATH:
            key += "-etl"
        if self.task:
            key += f"-{self.task}"
        return f"{key}-{self.fault}" if self.fault else key

    @property
    def search(self) -> str | None:
        """A search cell's early stopping (trainer.search.EARLY_STOPPING), None for any other cell."""
        return self.task.removeprefix("search-") if self.task in SEARCH_TASKS else None

    @property
    def trained(self) -> Cell | None:
        """A serve cell's trained cell, whose checkpoint it serves (task_plan["serves_framework"]); None for
        any other cell. Its options are the serve cell's: the checkpoint's config hash is the served
        config's."""
        if self.task != SERVE_TASK:
            return None
        return Cell(self.task_plan["serves_framework"], self.gpus, self.epochs, self.seed, self.profile,
                    self.trainer_config, strategy=self.strategy, model=self.model, data_path=self.data_path)

    @property
    def fault_plan(self) -> Fault | None:
        return Fault.parse(self.fault) if self.fault else None

    @property
    def elastic(self) -> bool:
        """A faulted cell whose plan has the survivors go on without the lost node (recovery: elastic)."""
        return self.fault_plan is not None and self.fault_plan.elastic

    @property
    def undisturbed(self) -> Cell:
        """The same cell without its fault: the run a faulted one is measured against."""
        return Cell(self.framework, self.gpus, self.epochs, self.seed, self.profile, self.trainer_config,
                    strategy=self.strategy, model=self.model, data_path=self.data_path, task=self.task,
                    task_plan=self.task_plan)

    def to_dict(self) -> dict[str, Any]:
        return {
            "framework": self.framework,
            "gpus": self.gpus,
            "epochs": self.epochs,
            "seed": self.seed,
            "profile": self.profile,
            "trainer_config": dict(self.trainer_config),
            **({"fault": self.fault} if self.fault else {}),
            **({"strategy": self.strategy} if self.strategy != strategies.DEFAULT else {}),
            **({"model": self.model} if self.model else {}),
            **({"data_path": self.data_path} if self.data_path != DEFAULT_DATA_PATH else {}),
            **({"task": self.task, "task_plan": dict(self.task_plan)} if self.task else {}),
        }


def model_label(model: str) -> str:
    """A model's name in cell keys and the report: generated:bert-mini and prajjwal1/bert-mini ->
    bert-mini (matrix.load refuses two models of one label in a profile)."""
    from trainer.config import GENERATED_MODEL_PREFIX

    return model.removeprefix(GENERATED_MODEL_PREFIX).rstrip("/").rsplit("/", 1)[-1]


def trainer_options(cell: Cell) -> dict[str, Any]:
    """The trainer options of one cell (TrainConfig keys), without the per-node paths bench adds. The
    strategy is named only when not the default: the trainer hashes it only when set, and so does
    config_hash, so a ddp cell's hash stays what it was before strategies existed."""
    return {
        **dict(cell.trainer_config),
        "epochs": cell.epochs,
        "seed": cell.seed,
        "framework": cell.framework,
        **({"strategy": cell.strategy} if cell.strategy != strategies.DEFAULT else {}),
        **({"data_path": cell.data_path} if cell.data_path != DEFAULT_DATA_PATH else {}),
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
    if cell.fault:  # an undisturbed cell's hash stays what it was before fault plans existed
        identity["fault"] = cell.fault
    if cell.task:  # so does a training cell's before tasks existed; a search's plan is its identity too
        identity.update(task=cell.task, task_plan=dict(cell.task_plan))
    if identity.get("dataset") == GENERATED_DATASET:
        identity["generated_data_version"] = GENERATED_DATA_VERSION
    if str(identity.get("model", "")).startswith(GENERATED_MODEL_PREFIX):
        identity["generated_tokenizer_version"] = GENERATED_TOKENIZER_VERSION
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]
