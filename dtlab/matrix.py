"""experiments/matrix.yml -> validated matrix cells, in a stable order.

A profile expands each `runs:` entry to frameworks x gpus x epochs x seeds. Everything wrong with the
file (unknown framework or profile, epochs <= 0, more GPUs than the inventory has, duplicate cells,
unknown trainer options) is one DtlabError line, raised before anything starts.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dtlab import paths
from dtlab.cell import Cell
from dtlab.errors import DtlabError

MATRIX_FILE = paths.EXPERIMENTS_DIR / "matrix.yml"
FRAMEWORKS = ("ddp", "spark", "determined")
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
    "device",
    "threads",
)
RUN_KEYS = {"frameworks": "framework", "gpus": "gpus", "epochs": "epochs", "seeds": "seed"}


@dataclass(frozen=True)
class Matrix:
    profile: str
    description: str
    timeout_s: int
    cells: tuple[Cell, ...]
    source: Path

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
    """Read and validate one profile. max_gpus and device: what the target inventory offers and
    trains on (None = don't check)."""
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
    if not isinstance(spec, dict):
        raise DtlabError(f"{where}: must be a mapping with trainer: and runs:")
    unknown = set(spec) - {"description", "timeout_s", "trainer", "runs"}
    if unknown:
        raise DtlabError(
            f"{where}: unknown key {sorted(unknown)[0]!r}; allowed: description, timeout_s, trainer, runs"
        )

    trainer_options = _trainer_options(where, spec.get("trainer") or {}, device)
    timeout_s = spec.get("timeout_s", DEFAULT_TIMEOUT_S)
    if not isinstance(timeout_s, int) or isinstance(timeout_s, bool) or timeout_s <= 0:
        raise DtlabError(f"{where}.timeout_s: must be a positive number of seconds, got {timeout_s!r}")

    runs = spec.get("runs")
    if not isinstance(runs, list) or not runs:
        raise DtlabError(f"{where}.runs: must be a non-empty list of {{frameworks, gpus, epochs, seeds}}")
    cells: list[Cell] = []
    first_seen: dict[Cell, str] = {}
    for index, run in enumerate(runs):
        run_where = f"{where}.runs[{index}]"
        for cell in _expand(run_where, run, profile, trainer_options):
            if max_gpus is not None and cell.gpus > max_gpus:
                raise DtlabError(
                    f"{run_where}.gpus: {cell.gpus} GPUs but the inventory offers {max_gpus}; "
                    "lower gpus or add workers/GPUs to the inventory"
                )
            if cell in first_seen:
                raise DtlabError(
                    f"{run_where}: duplicate cell {cell.key} (already in {first_seen[cell]}); "
                    "remove one of them"
                )
            first_seen[cell] = run_where
            cells.append(cell)
    return Matrix(
        profile=profile,
        description=str(spec.get("description", "")),
        timeout_s=timeout_s,
        cells=tuple(cells),
        source=path,
    )


def _read(path: Path) -> dict[str, Any]:
    try:
        document = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise DtlabError(f"{path}: cannot read ({exc.strerror}); pass an existing --matrix file") from None
    except yaml.YAMLError as exc:
        raise DtlabError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    if (
        not isinstance(document, dict)
        or not isinstance(document.get("profiles"), dict)
        or not document["profiles"]
    ):
        raise DtlabError(f"{path}: needs a top-level 'profiles:' mapping of named profiles")
    return document


def _trainer_options(where: str, options: Any, device: str | None) -> dict[str, Any]:
    from trainer.config import ConfigError, TrainConfig, from_dict

    if not isinstance(options, dict):
        raise DtlabError(f"{where}.trainer: must be a mapping of trainer options")
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    for key in options:
        if key in HARNESS_OWNED_OPTIONS:
            raise DtlabError(
                f"{where}.trainer.{key}: set per cell by the harness; use runs: (epochs, seeds) "
                "or the inventory (device) instead"
            )
        if key not in known:
            raise DtlabError(
                f"{where}.trainer.{key}: unknown trainer option; see "
                "`python -m trainer.launchers.torchrun --help`"
            )
    # The trainer's own rules, here on the controller: a bad value stops the matrix before any cell
    # starts or any attempt is recorded. Paths are the nodes' business (bench checks them there).
    try:
        from_dict({**options, **({"device": device} if device else {})}, local=False)
    except ConfigError as error:
        raise DtlabError(f"{where}.trainer.{error}") from None
    return dict(sorted(options.items()))


def _as_list(where: str, value: Any) -> list[Any]:
    values = value if isinstance(value, list) else [value]
    if not values:
        raise DtlabError(f"{where}: is empty; give at least one value")
    return values


def _positive_int(where: str, value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise DtlabError(f"{where}: {what} must be an integer >= 1, got {value!r}")
    return value


def _expand(where: str, run: Any, profile: str, trainer_options: dict[str, Any]) -> Iterator[Cell]:
    if not isinstance(run, dict):
        raise DtlabError(f"{where}: must be a mapping with frameworks, gpus, epochs, seeds")
    missing = [k for k in RUN_KEYS if k not in run]
    extra = sorted(set(run) - set(RUN_KEYS))
    if missing or extra:
        problem = f"missing {missing[0]!r}" if missing else f"unknown key {extra[0]!r}"
        raise DtlabError(f"{where}: {problem}; each run needs exactly frameworks, gpus, epochs, seeds")
    frameworks = _as_list(f"{where}.frameworks", run["frameworks"])
    for framework in frameworks:
        if framework not in FRAMEWORKS:
            raise DtlabError(
                f"{where}.frameworks: unknown framework {framework!r}; choose from {', '.join(FRAMEWORKS)}"
            )
    gpus = [_positive_int(f"{where}.gpus", g, "gpus") for g in _as_list(f"{where}.gpus", run["gpus"])]
    epochs = [
        _positive_int(f"{where}.epochs", e, "epochs") for e in _as_list(f"{where}.epochs", run["epochs"])
    ]
    seeds = _as_list(f"{where}.seeds", run["seeds"])
    for seed in seeds:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise DtlabError(f"{where}.seeds: seed must be an integer, got {seed!r}")
    # Stable order: epochs, then seeds, then GPUs, then framework, so frameworks interleave in time.
    for epoch_count, seed, gpu_count, framework in itertools.product(epochs, seeds, gpus, frameworks):
        yield Cell(
            framework=framework,
            gpus=gpu_count,
            epochs=epoch_count,
            seed=seed,
            profile=profile,
            trainer_config=trainer_options,
        )
