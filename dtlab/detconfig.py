"""Determined experiment configs (experiments/determined/*.yaml): offline validation and the context dir.

experiments/determined/schema.json describes the fields dtlab uses (Determined 0.38), checked here with
jsonschema. It is ours, not Determined's, because Determined's own cannot check a config offline: the
determined wheel (0.38.1) ships no expconf schema at all (the master validates a config when it is
submitted), and the expconf schemas in Determined's source tree (schemas/expconf/v0) lean on keywords
that only Determined's Go code implements (optionalRef, union, checks, conditional, eventuallyRequired),
which a standard JSON Schema validator silently ignores. Hyperparameters are trainer options, checked by
the trainer's own schema and rules. Every failure is one DtlabError line that names the file and the key.

    config = detconfig.load_experiment("experiments/determined/bert-tiny-imdb-2slot.yaml")
    context = detconfig.stage_context("/tmp/ctx")  # det experiment create <config> /tmp/ctx
"""

from __future__ import annotations

import functools
import json
import shutil
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from dtlab import paths
from dtlab.errors import DtlabError

EXPERIMENTS_DIR = paths.EXPERIMENTS_DIR / "determined"
SCHEMA_PATH = EXPERIMENTS_DIR / "schema.json"
STARTUP_HOOK = EXPERIMENTS_DIR / "startup-hook.sh"
LAUNCH_MODULE = "determined.launch.torch_distributed"
TRAINER_MODULE = "trainer.launchers.determined"
# Hyperparameters that are paths on the node, not protocol: the harness passes them as flags.
PATH_OPTIONS = ("output_dir", "checkpoint_dir", "cache_dir")


@functools.cache
def load_schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text())


def experiment_configs() -> list[Path]:
    return sorted(EXPERIMENTS_DIR.glob("*.yaml"))


def load_experiment(path: str | Path) -> dict[str, Any]:
    """Read and validate one experiment config file."""
    path = Path(path)
    try:
        config = yaml.safe_load(path.read_text())
    except OSError as error:
        raise DtlabError(f"{path}: cannot read ({error.strerror}); check the path") from None
    except yaml.YAMLError as error:
        raise DtlabError(f"{path}: not valid YAML ({str(error).splitlines()[0]}); fix the syntax") from None
    return validate_experiment(config, source=str(path))


def validate_experiment(config: Any, source: str = "experiment config") -> dict[str, Any]:
    """Check `config` against schema.json and the trainer's options; return it unchanged."""
    validator = jsonschema.Draft202012Validator(load_schema())
    errors = list(validator.iter_errors(config))
    # A misspelt key also makes the real one "missing": name the misspelling, the likelier fix.
    unknown_keys = [error for error in errors if error.validator == "additionalProperties"]
    error = unknown_keys[0] if unknown_keys else jsonschema.exceptions.best_match(errors)
    if error is not None:
        key = ".".join(str(part) for part in error.absolute_path) or "(top level)"
        raise DtlabError(f"{source}: {key}: {_one_line(error.message)}; see {SCHEMA_PATH.name}")
    entrypoint = config["entrypoint"]
    entrypoint = " ".join(entrypoint) if isinstance(entrypoint, list) else entrypoint
    for module in (LAUNCH_MODULE, TRAINER_MODULE):
        if module not in entrypoint:
            raise DtlabError(f"{source}: entrypoint: must run {module}; "
                             f"use 'python3 -m {LAUNCH_MODULE} python3 -m {TRAINER_MODULE}'")
    _check_hyperparameters(config["hyperparameters"], source)
    return config


def _check_hyperparameters(hyperparameters: dict[str, Any], source: str) -> None:
    from trainer.config import ConfigError, from_dict

    for name in hyperparameters:
        if name in PATH_OPTIONS:
            raise DtlabError(f"{source}: hyperparameters.{name}: a node path, not a hyperparameter; "
                             "pass it as a flag in the entrypoint")
    # The trainer checks every name and value; its path checks get a scratch directory so nothing is
    # created here.
    with tempfile.TemporaryDirectory(prefix="dtlab-detconfig-") as scratch:
        try:
            from_dict({**hyperparameters, "output_dir": scratch, "cache_dir": scratch})
        except ConfigError as error:
            raise DtlabError(f"{source}: hyperparameters.{error}") from None


def _one_line(message: str) -> str:
    return " ".join(message.split())[:300]


def stage_context(destination: str | Path) -> Path:
    """Build a Determined context directory: startup-hook.sh at its top (Determined only runs it from
    there), the trainer package, constraints.txt, and requirements.txt from pyproject.toml."""
    destination = Path(destination)
    destination.mkdir(parents=True, exist_ok=True)
    shutil.copy2(STARTUP_HOOK, destination / STARTUP_HOOK.name)
    shutil.copy2(paths.CONSTRAINTS_FILE, destination / paths.CONSTRAINTS_FILE.name)
    shutil.copytree(paths.REPO_ROOT / "trainer", destination / "trainer", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    project = tomllib.loads((paths.REPO_ROOT / "pyproject.toml").read_text())["project"]
    requirements = [*project["dependencies"], *project["optional-dependencies"]["determined"]]
    (destination / "requirements.txt").write_text(
        "# Written by dtlab.detconfig.stage_context from pyproject.toml; pinned by constraints.txt.\n"
        + "\n".join(requirements) + "\n")
    return destination
