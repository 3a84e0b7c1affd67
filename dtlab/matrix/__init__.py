"""experiments/matrix.yml -> validated matrix cells, in a stable order.

A profile expands each `runs:` entry to frameworks x strategies x models x data_paths x gpus x epochs x
seeds (strategies: the trainer's parallelism strategies, default [ddp]; a run's `strategies:` is the one
place a profile names them, so its `trainer:` may not, and so with data_paths, default [loader]; models:
default the profile's `trainer: model`, whose cells keep the keys and hashes they had before the axis
existed). A profile with a `search:` or a `serve:` section (scenario C) adds that task's cells
(dtlab/matrix/tasks.py): search cells in place of the training ones, serve cells after them. The file's
shape (keys, types, ranges, frameworks) is SCHEMA below, whose profiles' `trainer:` sections are the
trainer's own schema (trainer.config.SCHEMA, referred to by its $id, not copied); what a schema cannot
say (more GPUs than the inventory has, duplicate cells, the trainer's rules for the inventory's device)
is checked in code after it. Everything wrong is one DtlabError line naming the file and the key, raised
before anything starts.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from referencing import Registry, Resource

from dtlab import paths
from dtlab.cell import DEFAULT_DATA_PATH, FAULT_KINDS, RECOVERY_MODES, Cell, Fault, model_label
from dtlab.errors import DtlabError
from dtlab.matrix.tasks import EARLY_STOPPING_KEY, ServeSpec, profile_task, search_cells, with_serve_cells
from dtlab.search import SearchSpec
from trainer import config as trainer_config
from trainer import options as config_options
from trainer import strategies
from trainer.schema import first_error
from trainer.search import EARLY_STOPPING

MATRIX_FILE = paths.EXPERIMENTS_DIR / "matrix.yml"
DEFAULT_TIMEOUT_S = 3600
# Trainer options the harness sets per cell and per node; a profile must not fix them.
HARNESS_OWNED_OPTIONS = (
    "epochs",
    "seed",
    "framework",
    "framework_label",
    "output_dir",
    "checkpoint_dir",
    "cache_dir",
    "platform_data_dir",
    "device",
    "threads",
)
RUN_KEYS = ("frameworks", "gpus", "epochs", "seeds")
# A run entry's optional axes: the trainer's parallelism strategies (trainer.strategies.NAMES), and
# models other than the profile's (a model size each; the report sets them side by side).
STRATEGIES_KEY = "strategies"
MODELS_KEY = "models"
# ... and where the tokens come from (trainer.config.DATA_PATHS): the DataLoader's, or the platform's own
# ETL (Spark's, Ray Data's); a platform without one refuses it (Platform.data_path_refusal).
DATA_PATHS_KEY = "data_paths"
_DEFAULT_MODEL = next(f.default for f in dataclasses.fields(trainer_config.TrainConfig) if f.name == "model")


def _one_or_more(item: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [item, {"type": "array", "minItems": 1, "items": item}]}


_POSITIVE_INTEGER = {"type": "integer", "minimum": 1}
SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "urn:dtlab:matrix",
    "title": "experiments/matrix.yml",
    "type": "object",
    "required": ["profiles"],
    "additionalProperties": False,
    "properties": {
        "default_profile": {"type": "string"},
        "profiles": {
            "type": "object",
            "minProperties": 1,
            "additionalProperties": {"$ref": "#/$defs/profile"},
        },
    },
    "$defs": {
        "profile": {
            "type": "object",
            "required": ["runs"],
            "additionalProperties": False,
            "properties": {
                "description": {"type": "string"},
                "timeout_s": {
                    **_POSITIVE_INTEGER,
                    "x-message": "must be a positive number of seconds (per cell), got {value!r}",
                },
                "trainer": {
                    "$ref": trainer_config.SCHEMA["$id"],
                    "properties": {
                        option: {
                            "not": {},
                            "x-message": "set per cell by the harness; use runs: (epochs, seeds) "
                            "or the inventory (device) instead",
                        }
                        for option in HARNESS_OWNED_OPTIONS
                    }
                    | {
                        "strategy": {
                            "not": {},
                            "x-message": "set per run: list it under the run's strategies: (e.g. "
                            "strategies: [ddp, zero1]), the one place a profile names strategies",
                        },
                        "data_path": {
                            "not": {},
                            "x-message": "set per run: list it under the run's data_paths: (e.g. "
                            "data_paths: [loader, platform]), the one place a profile names data paths",
                        },
                    },
                },
                "runs": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/run"}},
                "fault": {"$ref": "#/$defs/fault"},
                # Scenario C's hyperparameter search: its space, trials and budget (dtlab/search.py checks
                # the rest, against the profile's trainer: options).
                "search": {"type": "object"},
                # ... or serving a trained cell's checkpoint under a load test (dtlab/matrix/tasks.py).
                "serve": {"type": "object"},
                # The quality a run must reach to count in the report's score (MLPerf-style; a run
                # under it is dropped, two invalidate the cell): docs/results-and-report.md.
                "target_accuracy": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "maximum": 1,
                    "x-message": "must be a validation accuracy above 0 and at most 1 (e.g. 0.80), "
                    "got {value!r}",
                },
            },
        },
        # A fault plan: each cell runs undisturbed, then again with this fault (docs/faults.md).
        "fault": {
            "type": "object",
            "required": ["kind", "after_epoch"],
            "additionalProperties": False,
            "properties": {
                "kind": {"enum": list(FAULT_KINDS)},
                "after_epoch": {**_POSITIVE_INTEGER, "x-message": "must be an epoch >= 1, got {value!r}"},
                "node": {"type": "string", "pattern": "^[A-Za-z0-9_.-]+$"},
                "seconds": {**_POSITIVE_INTEGER, "x-message": "must be seconds >= 1, got {value!r}"},
                "recovery": {"enum": list(RECOVERY_MODES)},
            },
        },
        "run": {
            "type": "object",
            "required": [key for key in RUN_KEYS if key != "epochs"],  # a search's budget sets them
            "additionalProperties": False,
            "properties": {
                "frameworks": _one_or_more({"enum": list(paths.platform_names())}),  # dtlab/platforms/<name>/
                # Optional (default: ddp alone); each strategy once: a repeated one is the same cell twice.
                STRATEGIES_KEY: {
                    **_one_or_more({"$ref": trainer_config.SCHEMA["$id"] + "#/properties/strategy"}),
                    "allOf": [{"uniqueItems": True, "x-message": "each strategy once, got {value!r}"}],
                },
                # Optional (default: loader alone); each data path once.
                DATA_PATHS_KEY: {
                    **_one_or_more({"$ref": trainer_config.SCHEMA["$id"] + "#/properties/data_path"}),
                    "allOf": [{"uniqueItems": True, "x-message": "each data path once, got {value!r}"}],
                },
                # Optional (default: the profile's trainer: model); each model once.
                MODELS_KEY: {
                    **_one_or_more({"$ref": trainer_config.SCHEMA["$id"] + "#/properties/model"}),
                    "allOf": [{"uniqueItems": True, "x-message": "each model once, got {value!r}"}],
                },
                "gpus": _one_or_more(_POSITIVE_INTEGER),
                "epochs": _one_or_more(_POSITIVE_INTEGER),
                EARLY_STOPPING_KEY: {
                    **_one_or_more({"enum": list(EARLY_STOPPING)}),
                    "allOf": [{"uniqueItems": True, "x-message": "each early stopping once, got {value!r}"}],
                },
                # N runs per cell are N seeds: a seed run twice is the same experiment (same config
                # hash), which bench.all skips and the store would not keep apart.
                "seeds": {
                    "anyOf": [
                        {"type": "integer"},
                        {
                            "type": "array",
                            "minItems": 1,
                            "items": {"type": "integer"},
                            "allOf": [
                                {
                                    "uniqueItems": True,
                                    "x-message": "each seed once (a repeated seed is the same run; for N "
                                    "runs per cell list N seeds), got {value!r}",
                                }
                            ],
                        },
                    ]
                },
            },
        },
    },
}
_VALIDATOR = jsonschema.Draft202012Validator(
    SCHEMA,
    registry=Registry().with_resource(
        trainer_config.SCHEMA["$id"], Resource.from_contents(trainer_config.SCHEMA)
    ),
)


@dataclass(frozen=True)
class Matrix:
    profile: str
    description: str
    timeout_s: int
    cells: tuple[Cell, ...]
    source: Path
    target_accuracy: float | None = None  # a run under it does not count in the report's score

    def __iter__(self) -> Iterator[Cell]:
        return iter(self.cells)

    def __len__(self) -> int:
        return len(self.cells)

    def select(self, only: str | None) -> Matrix:
        """Keep the cells matching --only (comma-separated; e.g. 'ddp', 'g2', 'spark-g1', 'ddp-g*-e20-s1')."""
        if not only:
            return self
        patterns = [p.strip() for p in only.split(",") if p.strip()]
        chosen = tuple(c for c in self.cells if any(_matches(c, p) for p in patterns))
        if not chosen:
            raise DtlabError(
                f"--only {only!r}: matches no cell of profile {self.profile}; "
                f"cells are e.g. {', '.join(c.key for c in self.cells[:4])}"
            )
        return dataclasses.replace(self, cells=chosen)


def _matches(cell: Cell, pattern: str) -> bool:
    """Every '-'-separated part of the pattern matches some part of the cell key (globs allowed)."""
    if fnmatch.fnmatchcase(cell.key, pattern):
        return True
    key_parts = cell.key.split("-")
    return all(any(fnmatch.fnmatchcase(k, p) for k in key_parts) for p in pattern.split("-"))


def profiles(path: Path = MATRIX_FILE) -> list[str]:
    return list(_read(path)["profiles"])


def load(
    profile: str | None = None,
    path: str | Path | None = None,
    max_gpus: int | None = None,
    device: str | None = None,
) -> Matrix:
    """Read the file (all of it is checked) and expand one profile. max_gpus and device: what the
    target inventory offers and trains on (None = don't check)."""
    path = Path(path) if path else MATRIX_FILE
    document = _read(path)
    available = document["profiles"]
    profile = (
        profile or document.get("default_profile") or (next(iter(available)) if len(available) == 1 else None)
    )
    if profile is None:
        raise DtlabError(
            f"{path}: several profiles and no default_profile; pass --profile ({', '.join(available)})"
        )
    if profile not in available:
        raise DtlabError(f"{path}: no profile {profile!r}; choose one of {', '.join(available)}")
    spec = available[profile]
    where = f"{path}: profiles.{profile}"
    trainer_options = dict(sorted((spec.get("trainer") or {}).items()))
    profile_model = trainer_options.get("model", _DEFAULT_MODEL)
    _check_model_labels(where, profile_model, spec["runs"])
    # The trainer's rules for the options under each strategy and model the runs use (some options are
    # one strategy's: pipeline's microbatches), the first run naming a pair named with it.
    used: dict[tuple[str, str], str] = {}
    for index, run in enumerate(spec["runs"]):
        for strategy, model in itertools.product(_as_list(run.get(STRATEGIES_KEY, strategies.DEFAULT)),
                                                 _run_models(run, profile_model)):
            used.setdefault((strategy, model), f"runs[{index}]")
    configs = _check_trainer_rules(where, trainer_options, device, used)
    fault = _fault(f"{where}.fault", spec.get("fault"))
    task = profile_task(where, spec, trainer_options)
    cells: list[Cell] = []
    first_seen: dict[Cell, str] = {}
    for index, run in enumerate(spec["runs"]):
        run_where = f"{where}.runs[{index}]"
        for cell in _expand(run, profile, trainer_options, fault, profile_model, task):
            if fault is not None and fault.after_epoch >= cell.epochs:
                raise DtlabError(
                    f"{where}.fault.after_epoch: {fault.after_epoch}, but cell {cell.undisturbed.key} has "
                    f"{cell.epochs} epochs: the fault would hit after training ended; lower after_epoch"
                )
            if max_gpus is not None and cell.gpus > max_gpus:
                raise DtlabError(
                    f"{run_where}.gpus: {cell.gpus} GPUs but the inventory offers {max_gpus}; "
                    "lower gpus or add workers/GPUs to the inventory"
                )
            refusal = _split_refusal(configs[(cell.strategy, cell.model)], cell.gpus)
            if refusal:
                raise DtlabError(f"{run_where}: cell {cell.key}: {refusal}")
            if cell in first_seen:
                raise DtlabError(
                    f"{run_where}: duplicate cell {cell.key} (already in {first_seen[cell]}); "
                    "remove one of them"
                )
            first_seen[cell] = run_where
            cells.append(cell)
    if isinstance(task, SearchSpec):  # seed by seed across the runs, so the ways interleave in time
        cells.sort(key=lambda cell: cell.seed)
    return Matrix(
        profile=profile,
        description=spec.get("description", ""),
        timeout_s=spec.get("timeout_s", DEFAULT_TIMEOUT_S),
        cells=tuple(cells),
        source=path,
        target_accuracy=spec.get("target_accuracy"),
    )


def _read(path: Path) -> dict[str, Any]:
    """The whole file, checked against SCHEMA (every profile, not only the one that runs)."""
    try:
        document = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise DtlabError(f"{path}: cannot read ({exc.strerror}); pass an existing --matrix file") from None
    except yaml.YAMLError as exc:
        raise DtlabError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    problem = first_error(_VALIDATOR, _typed(path, document))
    if problem is not None:
        raise DtlabError(f"{path}: {problem}")
    return document


def _typed(path: Path, document: Any) -> Any:
    """The document with each profile's trainer options parsed as the trainer parses them (YAML reads
    1e-3 as a string; the trainer takes it), so the schema checks what the trainer will get."""
    if not isinstance(document, dict) or not isinstance(document.get("profiles"), dict):
        return document
    profiles = {}
    for name, spec in document["profiles"].items():
        if isinstance(spec, dict) and isinstance(spec.get("trainer") or {}, dict):
            try:
                spec = {**spec, "trainer": config_options.convert(spec.get("trainer") or {})}
            except trainer_config.ConfigError as error:
                raise DtlabError(f"{path}: profiles.{name}.trainer.{error}") from None
        profiles[name] = spec
    return {**document, "profiles": profiles}


def _run_models(run: dict[str, Any], profile_model: str) -> list[str]:
    """A run's models as cells name them: "" for the profile's own (listed or not), else the model id."""
    return ["" if model == profile_model else model for model in _as_list(run.get(MODELS_KEY, profile_model))]


def _check_model_labels(where: str, profile_model: str, runs: list[dict[str, Any]]) -> None:
    """Two models of one profile may not share a label (cell.model_label): their cells' keys would."""
    seen = {model_label(profile_model): profile_model}
    for index, run in enumerate(runs):
        for model in _as_list(run.get(MODELS_KEY, [])):
            other = seen.setdefault(model_label(model), model)
            if other != model:
                raise DtlabError(
                    f"{where}.runs[{index}].{MODELS_KEY}: {model} and {other} would both be "
                    f"{model_label(model)!r} in cell keys; keep one of them in this profile"
                )


def _check_trainer_rules(
    where: str, options: dict[str, Any], device: str | None, used: dict[tuple[str, str], str]
) -> dict[tuple[str, str], trainer_config.TrainConfig]:
    """The trainer's own rules for the whole config, here on the controller with the inventory's device,
    under each strategy and model the runs use (`used`: (strategy, model or "") -> the first run naming
    it; some options are one strategy's): a bad value stops the matrix before any cell starts or any
    attempt is recorded. An error that only some of them meet names the run, strategy and model. Paths are
    the nodes' business (bench checks them there). Returns each pair's config."""
    errors: dict[tuple[str, str], str] = {}
    configs = {}
    for strategy, model in used:
        try:
            configs[(strategy, model)] = config_options.from_dict(
                {**options, **({"model": model} if model else {}), **({"device": device} if device else {}),
                 "strategy": strategy},
                local=False,
            )
        except trainer_config.ConfigError as error:
            errors[(strategy, model)] = str(error)
    if not errors:
        return configs
    (strategy, model), error = next(iter(errors.items()))
    if not model and len(errors) == len(used) and len(set(errors.values())) == 1:
        raise DtlabError(f"{where}.trainer.{error}")
    under = f"strategy {strategy}" + (f", model {model}" if model else "")
    raise DtlabError(f"{where}.trainer.{error} (under {used[(strategy, model)]}'s {under})")


def _split_refusal(cfg: trainer_config.TrainConfig, world_size: int) -> str | None:
    """The trainer's refusal of this strategy's split of the model over the cell's workers (a head or layer
    count, the pipeline's microbatches), found here for a model whose shape is known without loading it."""
    shape = trainer_config.known_model_shape(cfg.model)
    return strategies.split_refusal(cfg, shape, world_size) if shape is not None else None


def _fault(where: str, spec: dict[str, Any] | None) -> Fault | None:
    if spec is None:
        return None
    seconds = spec.get("seconds")
    if spec["kind"] == "netdrop" and seconds is None:
        raise DtlabError(f"{where}.seconds: a netdrop needs seconds (how long the network stays down)")
    if spec["kind"] != "netdrop" and seconds is not None:
        raise DtlabError(f"{where}.seconds: only a netdrop lasts; {spec['kind']} takes no seconds")
    recovery = spec.get("recovery", RECOVERY_MODES[0])
    if recovery == "elastic" and spec["kind"] != "kill":
        raise DtlabError(f"{where}.recovery: elastic goes on without a lost node, which a kill makes; a "
                         f"{spec['kind']} leaves every node in the cell: use recovery restart")
    return Fault(spec["kind"], spec["after_epoch"], spec.get("node"), seconds, recovery)


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _expand(
    run: dict[str, Any],
    profile: str,
    trainer_options: dict[str, Any],
    fault: Fault | None = None,
    profile_model: str = _DEFAULT_MODEL,
    task: SearchSpec | ServeSpec | None = None,
) -> Iterator[Cell]:
    if isinstance(task, SearchSpec):
        yield from search_cells(run, profile, trainer_options, task)
        return
    frameworks, gpus, epochs, seeds = (_as_list(run[key]) for key in RUN_KEYS)
    strategy_names = _as_list(run.get(STRATEGIES_KEY, strategies.DEFAULT))
    data_paths = _as_list(run.get(DATA_PATHS_KEY, DEFAULT_DATA_PATH))
    # Stable order: epochs, then seeds, then GPUs, then model, then strategy, then data path, then
    # framework, so frameworks interleave in time (and a run without strategies:, models: or data_paths:
    # keeps the order it had before they existed).
    for epoch_count, seed, gpu_count, model, strategy, data_path, framework in itertools.product(
        epochs, seeds, gpus, _run_models(run, profile_model), strategy_names, data_paths, frameworks
    ):
        cell = Cell(
            framework=framework,
            gpus=gpu_count,
            epochs=epoch_count,
            seed=seed,
            profile=profile,
            trainer_config=trainer_options,  # Cell puts a models: entry's model in it
            strategy=strategy,
            model=model,
            data_path=data_path,
        )
        if isinstance(task, ServeSpec):  # each way serves it right after it trains
            yield from with_serve_cells(cell, task)
            continue
        yield cell
        if fault is not None:  # the faulted run right after its undisturbed twin, on the same nodes
            yield dataclasses.replace(cell, fault=fault.spec)
