"""Determined experiment configs (experiments/determined/*.yaml): offline validation and the context dir.

experiments/determined/schema.json describes the fields dtlab uses (Determined 0.38), checked here with
jsonschema. It is ours, not Determined's, because Determined's own cannot check a config offline: the
determined wheel (0.38.1) ships no expconf schema at all (the master validates a config when it is
submitted), and the expconf schemas in Determined's source tree (schemas/expconf/v0) lean on keywords
that only Determined's Go code implements (optionalRef, union, checks, conditional, eventuallyRequired),
which a standard JSON Schema validator silently ignores. Hyperparameters are trainer options, checked by
the trainer's own schema and rules. Every failure is one DtlabError line that names the file and the key.

    from dtlab.platforms.determined import config as detconfig
    config = detconfig.load_experiment("experiments/determined/bert-tiny-imdb-2slot.yaml")
    context = detconfig.stage_context("/tmp/ctx")  # det experiment create <config> /tmp/ctx

The trial image (determined_trial_image): trial_image_probe_files() are what the harness runs inside it on
an agent (experiments/determined/trial_image_probe.py, offline), and trial_image_verdict() turns the
answer into one line: can the image's python3 install the pins, as startup-hook.sh will ask it to?
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import math
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from dtlab import paths, pins
from dtlab.errors import DtlabError
from dtlab.search import Dimension, SearchSpec

EXPERIMENTS_DIR = paths.EXPERIMENTS_DIR / "determined"
SCHEMA_PATH = EXPERIMENTS_DIR / "schema.json"
STARTUP_HOOK = EXPERIMENTS_DIR / "startup-hook.sh"
TRIAL_IMAGE_PROBE = EXPERIMENTS_DIR / "trial_image_probe.py"
TRIAL_IMAGE_DOCS = "docs/determined.md#the-trial-image"
LAUNCH_MODULE = "determined.launch.torch_distributed"
TRAINER_MODULE = "trainer.launchers.determined"
# What only an adaptive_asha searcher takes (schema.json).
ASHA_ONLY = ("max_trials", "time_metric", "max_time", "mode", "divisor", "max_rungs", "max_concurrent_trials")
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
    _check_searcher(config["searcher"], source)
    _check_hyperparameters(config["hyperparameters"], source)
    return config


def _check_searcher(searcher: dict[str, Any], source: str) -> None:
    if searcher["name"] == "adaptive_asha" and "max_length" in searcher:
        raise DtlabError(f"{source}: searcher.max_length: Determined 0.38's adaptive_asha measures a trial "
                         "by time_metric and max_time instead; remove it")
    searched = sorted(set(searcher) & set(ASHA_ONLY))
    if searcher["name"] != "adaptive_asha" and searched:
        raise DtlabError(f"{source}: searcher.{searched[0]}: only searcher adaptive_asha takes it; remove "
                         "it, or search with name: adaptive_asha")


def _check_hyperparameters(hyperparameters: dict[str, Any], source: str) -> None:
    from trainer.config import ConfigError
    from trainer.options import from_dict

    for name in hyperparameters:
        if name in PATH_OPTIONS:
            raise DtlabError(f"{source}: hyperparameters.{name}: a node path, not a hyperparameter; "
                             "pass it as a flag in the entrypoint")
    plain = {name: value for name, value in hyperparameters.items() if not isinstance(value, dict)}
    # A searched one's every value it can take at the edges (a range's bounds, each categorical value),
    # one at a time over the plain ones.
    trials = [plain] + [{**plain, name: value} for name, distribution in hyperparameters.items()
                        if isinstance(distribution, dict) for value in _distribution_edges(distribution)]
    # The trainer checks every name and value; its path checks get a scratch directory so nothing is
    # created here.
    with tempfile.TemporaryDirectory(prefix="dtlab-detconfig-") as scratch:
        for trial in trials:
            try:
                from_dict({**trial, "output_dir": scratch, "cache_dir": scratch})
            except ConfigError as error:
                raise DtlabError(f"{source}: hyperparameters.{error}") from None


def _distribution_edges(distribution: dict[str, Any]) -> list[Any]:
    """The values at the edges of one of Determined's hyperparameter distributions (schema.json)."""
    if distribution["type"] == "categorical":
        return list(distribution["vals"])
    low, high = distribution["minval"], distribution["maxval"]
    if distribution["type"] == "log":
        return [distribution["base"] ** low, distribution["base"] ** high]
    return [low, high]


def searcher_experiment(base: dict[str, Any], spec: SearchSpec, source: str,
                        concurrent_trials: int = 0) -> dict[str, Any]:
    """`base` (a single-trial experiment) as scenario C's search on Determined's own searcher: adaptive ASHA
    (Determined 0.38: time_metric and max_time, not max_length) over the same space, trial count, budget and
    reduction factor as Ray Tune's and dtlab's sweep. Determined samples its own configurations from the
    space (not dtlab's drawn list), so whether it finds the same best one is a measured question. mode
    aggressive is one bracket, as dtlab's Asha; its rungs are max_time / divisor^k, dtlab's grace x rf^k:
    the same when budget_epochs = grace_epochs x reduction_factor^(rungs - 1). Validated before returned."""
    hyperparameters = {**base["hyperparameters"], "epochs": spec.budget_epochs}
    hyperparameters.update({dimension.name: _distribution(dimension) for dimension in spec.space})
    searcher = {"name": "adaptive_asha", "metric": "val_accuracy", "smaller_is_better": False,
                "max_trials": spec.trials, "time_metric": "epochs", "max_time": spec.budget_epochs,
                "mode": "aggressive", "divisor": spec.reduction_factor, "max_rungs": len(spec.rungs()),
                "max_concurrent_trials": concurrent_trials}
    config = {**base, "name": f"{base['name']}-search", "hyperparameters": hyperparameters,
              "searcher": searcher}
    return validate_experiment(config, source)


def _distribution(dimension: Dimension) -> dict[str, Any]:
    if dimension.kind == "choice":
        return {"type": "categorical", "vals": list(dimension.values)}
    low, high = dimension.values
    if dimension.kind == "uniform":
        return {"type": "double", "minval": low, "maxval": high}
    return {"type": "log", "base": 10, "minval": math.log10(low), "maxval": math.log10(high)}


def _one_line(message: str) -> str:
    return " ".join(message.split())[:300]


def stage_context(destination: str | Path) -> Path:
    """Build a Determined context directory: startup-hook.sh at its top (Determined only runs it from
    there), the trainer package, constraints.txt, and requirements.txt (trial_requirements)."""
    destination = Path(destination)
    destination.mkdir(parents=True, exist_ok=True)
    shutil.copy2(STARTUP_HOOK, destination / STARTUP_HOOK.name)
    shutil.copy2(paths.CONSTRAINTS_FILE, destination / paths.CONSTRAINTS_FILE.name)
    shutil.copytree(paths.REPO_ROOT / "trainer", destination / "trainer", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (destination / "requirements.txt").write_text(_requirements_file())
    return destination


def trial_requirements() -> list[str]:
    """What startup-hook.sh installs (requirements.txt): the trainer's dependencies and its client."""
    return [*pins.dependencies(), *pins.platform_declarations()["determined"]["python_client"]]


def _requirements_file() -> str:
    return ("# Written by dtlab.platforms.determined.config (trial_requirements); constraints.txt pins.\n"
            + "\n".join(trial_requirements()) + "\n")


# --- the trial image: can its python3 install the pins? ---------------------------------------------
# Determined 0.38.1's task setup (master/static/srv/task-setup.sh) runs `python3 -m pip install --user` of
# its own wheel in every trial container, then sources startup-hook.sh, whose pip install takes the pins.
# The harness runs TRIAL_IMAGE_PROBE in the image on each agent (no network: pip with --no-index) and
# decides here, with the pins' Requires-Python from the controller's venv (constraints.txt's own freeze).

PROBE_MISSING_IMAGE_EXIT = 64  # the probe command's exit when the agent's Docker has no such image
DOCKER_RUN_FAILED = (125, 126, 127)  # docker run's own exits: the daemon, or the entrypoint, failed
_MISSING_DISTRIBUTION = re.compile(r"No matching distribution found for (\S+)|"
                                   r"Could not find a version that satisfies the requirement (\S+)")


@dataclass(frozen=True)
class TrialImageVerdict:
    node: str
    image: str
    ok: bool
    detail: str  # ok: what the image has; refused: the one line that says why and what to do


def trial_image_probe_files() -> dict[str, str]:
    """The probe and the startup hook's own inputs, by file name, as the image sees them side by side."""
    return {
        TRIAL_IMAGE_PROBE.name: TRIAL_IMAGE_PROBE.read_text(),
        paths.CONSTRAINTS_FILE.name: paths.CONSTRAINTS_FILE.read_text(),
        "requirements.txt": _requirements_file(),
    }


def trial_image_verdict(node: str, image: str, exit_code: int, stdout: str, stderr: str) -> TrialImageVerdict:
    """The probe's answer (TRIAL_IMAGE_PROBE's JSON line, or the probe command's failure) as a verdict."""

    def refused(reason: str, fix: str) -> TrialImageVerdict:
        line = f"determined: trial image {image} on {node} cannot install the pins: {reason}; {fix}"
        return TrialImageVerdict(node, image, False, f"{line} ({TRIAL_IMAGE_DOCS})")

    choose = "set determined_trial_image (inventory/group_vars/all.yml) to an image that can"
    if exit_code == PROBE_MISSING_IMAGE_EXIT:
        return refused("Docker there has no such image (Determined's agent would try to pull it)",
                       "build it there (ansible-playbook site.yml --tags trainer builds the trainer image) "
                       f"or docker pull it, or {choose}")
    report = _probe_report(stdout)
    if report is None:
        said = (stderr or stdout).strip().splitlines()
        last = said[-1][-200:] if said else "no output"  # the end of Docker's error says why
        docker_failed = exit_code in DOCKER_RUN_FAILED
        what = "Docker there cannot run it" if docker_failed else "the probe did not run in it"
        return refused(f"{what} (exit {exit_code}: {last})",
                       f"check that Docker runs it there (with /bin/bash inside), or {choose}")
    python = report.get("python")
    if not python:
        return refused("it has no python3 (Determined's task setup runs python3)", choose)
    if not report.get("pip"):
        return refused(f"its python3 {python} has no pip (Determined's task setup and startup-hook.sh run "
                       "python3 -m pip)", choose)
    dry_run = report.get("pip_dry_run") or {}
    errors = [str(line) for line in dry_run.get("errors") or []]
    if dry_run.get("exit") == 0:
        return TrialImageVerdict(node, image, True, f"python {python}, pip {report['pip']}: every pin "
                                                    "installed, startup-hook.sh has nothing to fetch")
    if any("externally-managed-environment" in line for line in errors):
        return refused(f"its python3 {python} is externally managed (PEP 668), so pip refuses to install "
                       "into it", choose)
    to_install = _pins_to_install(report)
    too_new = [(pin, needs) for pin, needs in to_install if needs and not _python_admits(needs, python)]
    if too_new:
        (first, needs), others = too_new[0], [pin.partition("==")[0] for pin, _ in too_new[1:]]
        rest = f" and {len(others) - 3} more" if len(others) > 3 else ""
        more = f" (so do {', '.join(others[:3])}{rest})" if others else ""
        return refused(f"{first} needs Python {needs}{more}, the image has {python}",
                       f"set determined_trial_image (inventory/group_vars/all.yml) to an image with "
                       f"Python {needs}")
    missing = [m.group(1) or m.group(2) for line in errors for m in [_MISSING_DISTRIBUTION.search(line)] if m]
    if missing or to_install:
        count = max(len(to_install), 1)
        example = to_install[0][0] if to_install else missing[0]
        return TrialImageVerdict(node, image, True, f"python {python}, pip {report['pip']}: startup-hook.sh "
                                                    f"installs {count} pin(s) at each trial start "
                                                    f"(e.g. {example}) from the index it reaches")
    return refused(f"pip's dry run of startup-hook.sh fails: {errors[-1][:200] if errors else 'no message'}",
                   choose)


def _probe_report(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                report = json.loads(line)
            except ValueError:
                return None
            return report if isinstance(report, dict) else None
    return None


def _pins_to_install(report: dict[str, Any]) -> list[tuple[str, str | None]]:
    """(name==pin, the pin's Requires-Python or None) for each pin startup-hook.sh would install in the image:
    in the requirements' dependency closure (markers as the image evaluates them) and not installed there at
    the pinned version; the requirements themselves first. The closure and Requires-Python come from the
    controller's venv (the same pins)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version

    installed = {str(k): str(v) for k, v in (report.get("installed") or {}).items()}
    closure = _pin_closure(report.get("markers") or {})
    direct = {canonicalize_name(Requirement(line).name) for line in trial_requirements()}
    needed = []
    for name, pin in sorted(closure.items(), key=lambda item: (item[0] not in direct, item[0])):
        try:
            if name in installed and Version(installed[name]).public == Version(pin).public:
                continue
        except InvalidVersion:
            pass
        needed.append((f"{name}=={pin}", _requires_python(name, pin)))
    return needed


def _pin_closure(markers: dict[str, str]) -> dict[str, str]:
    """{canonical name: pinned version} of the trial requirements and everything they pull in."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins = _constraint_pins()
    todo = [Requirement(line) for line in trial_requirements()]
    seen: set[tuple[str, frozenset[str]]] = set()
    closure: dict[str, str] = {}
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        key = (name, frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        if name in pins:
            closure[name] = pins[name]
        try:
            requires = importlib.metadata.distribution(name).requires or []
        except importlib.metadata.PackageNotFoundError:
            continue
        extras = {"", *requirement.extras}
        for line in requires:
            dependency = Requirement(line)
            if dependency.marker is None or any(dependency.marker.evaluate({**markers, "extra": extra})
                                                for extra in extras):
                todo.append(dependency)
    return closure


@functools.cache
def _constraint_pins() -> dict[str, str]:
    from packaging.utils import canonicalize_name

    pins = {}
    for line in paths.CONSTRAINTS_FILE.read_text().splitlines():
        name, sep, version = line.split("#")[0].strip().partition("==")
        if sep and name:
            pins[canonicalize_name(name)] = version.strip()
    return pins


def _requires_python(name: str, pin: str) -> str | None:
    """The pin's Requires-Python, read from the controller's venv when it holds that very version."""
    from packaging.version import InvalidVersion, Version

    try:
        dist = importlib.metadata.distribution(name)
        if Version(dist.version).public != Version(pin).public:
            return None
    except (importlib.metadata.PackageNotFoundError, InvalidVersion):
        return None
    return dist.metadata.get("Requires-Python") or None


def _python_admits(requires_python: str, python: str) -> bool:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        return SpecifierSet(requires_python).contains(Version(python), prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        return True  # a version pip itself could not read: let pip's own install decide
