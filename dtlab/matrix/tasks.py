"""A profile's scenario C task (issue #54), checked with its runs, and the cells it adds to them.

- A `search:` section (dtlab/search.py): each run expands to seeds x gpus x early_stopping x frameworks:
  search cells, each running the one drawn plan. Its runs name no epochs (the budget's) and no other axis.
- A `serve:` section: each run trains as in any profile, and each trained cell is followed by one serve
  cell per way, which serves that cell's checkpoint on the cluster and load-tests it from the controller
  (dtlab/loadtest.py runs this module's LoadPlan). Every way serves the same checkpoint, so their answers
  must be the same:

      serve:
        ways: [ddp, ray]          # the platforms serving it: ddp's plain server, Ray Serve
        concurrency: [1, 8, 32]   # the load test's levels
        requests: 256             # per level
        port: 8100                # where the servers listen on the nodes

A profile has one of them at most, and no fault plan with either. Everything wrong is one DtlabError
line naming the file and the key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from dtlab import paths
from dtlab.cell import SERVE_TASK, Cell
from dtlab.errors import DtlabError
from dtlab.search import SearchSpec, parse_search

# A search profile's runs name the early stopping each way runs with (default [asha]); the search's
# budget_epochs is every trial's epochs, so its runs name none, and no other training axis.
EARLY_STOPPING_KEY = "early_stopping"
TRAINING_ONLY_KEYS = ("epochs", "strategies", "models", "data_paths")
SERVE_KEYS = ("ways", "concurrency", "requests", "timeout_s", "port")
DEFAULT_SERVE_PORT = 8100
MAX_REQUESTS = 10_000  # per level: a load test is bounded, and this one ends in minutes
MAX_CONCURRENCY = 256
DEFAULT_CONCURRENCY = (1, 8, 32)


@dataclass(frozen=True)
class LoadPlan:
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    requests: int = 256  # per level
    timeout_s: float = 30.0  # per request

    @classmethod
    def from_dict(cls, data: dict, where: str) -> LoadPlan:
        unknown = sorted(set(data) - {"concurrency", "requests", "timeout_s"})
        if unknown:
            raise DtlabError(f"{where}: unknown key {unknown[0]}; use concurrency, requests, timeout_s")
        levels = data.get("concurrency", list(DEFAULT_CONCURRENCY))
        if not isinstance(levels, list) or not levels or not all(_int_in(n, 1, MAX_CONCURRENCY)
                                                                 for n in levels):
            raise DtlabError(f"{where}: concurrency: must be a list of integers 1-{MAX_CONCURRENCY}, "
                             f"got {levels!r}")
        requests = data.get("requests", cls.requests)
        if not _int_in(requests, max(levels), MAX_REQUESTS):
            raise DtlabError(f"{where}: requests: must be an integer from the highest concurrency "
                             f"({max(levels)}) to {MAX_REQUESTS}, got {requests!r}")
        timeout_s = data.get("timeout_s", cls.timeout_s)
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not 0 < timeout_s <= 600:
            raise DtlabError(f"{where}: timeout_s: must be a number of seconds in (0, 600], "
                             f"got {timeout_s!r}")
        return cls(tuple(levels), requests, float(timeout_s))


def _int_in(value, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


@dataclasses.dataclass(frozen=True)
class ServeSpec:
    ways: tuple[str, ...]
    load: LoadPlan
    port: int = DEFAULT_SERVE_PORT

    def plan(self, trained: Cell) -> dict[str, Any]:
        """A serve cell's task_plan: the framework of the trained cell it serves (Cell.trained has the rest),
        the load test, the port."""
        return {"serves_framework": trained.framework, "port": self.port,
                "load": {"concurrency": list(self.load.concurrency), "requests": self.load.requests,
                         "timeout_s": self.load.timeout_s}}


def profile_task(where: str, spec: Mapping[str, Any],
                 trainer_options: Mapping[str, Any]) -> SearchSpec | ServeSpec | None:
    """The profile's search or serve plan, checked with its runs; None for a training profile."""
    runs = spec["runs"]
    if "search" in spec and "serve" in spec:
        raise DtlabError(f"{where}: a profile searches or serves, not both; split it in two profiles")
    if "search" not in spec:
        for index, run in enumerate(runs):
            if "epochs" not in run:
                raise DtlabError(f"{where}.runs[{index}]: 'epochs' is a required property")
            if EARLY_STOPPING_KEY in run:
                raise DtlabError(f"{where}.runs[{index}].{EARLY_STOPPING_KEY}: only a profile with a search: "
                                 "section runs searches; add one, or remove early_stopping")
    if "fault" in spec and ("search" in spec or "serve" in spec):
        task = "search" if "search" in spec else "serve"
        raise DtlabError(f"{where}.fault: a {task} profile takes no fault plan; put the fault in a "
                         "training profile")
    if "serve" in spec:
        trained = {framework for run in runs for framework in _as_list(run["frameworks"])}
        if len(trained) > 1:
            raise DtlabError(f"{where}.runs: a serve profile trains the one checkpoint every way serves; "
                             f"list one framework, not {', '.join(sorted(trained))}")
        return parse_serve(spec["serve"], f"{where}.serve")
    if "search" not in spec:
        return None
    for index, run in enumerate(runs):
        named = next((key for key in TRAINING_ONLY_KEYS if key in run), None)
        if named == "epochs":
            raise DtlabError(f"{where}.runs[{index}].epochs: a search's trials train search.budget_epochs; "
                             "remove epochs")
        if named is not None:
            raise DtlabError(f"{where}.runs[{index}].{named}: a search's trials train the profile's trainer: "
                             f"options alone; remove {named}")
    return parse_search(spec["search"], trainer_options, where)


def parse_serve(raw: Any, where: str) -> ServeSpec:
    if not isinstance(raw, Mapping):
        raise DtlabError(f"{where}: must be a mapping with ways (and concurrency, requests, port)")
    unknown = sorted(set(raw) - set(SERVE_KEYS))
    if unknown:
        raise DtlabError(f"{where}: unknown key {unknown[0]}; the keys are {', '.join(SERVE_KEYS)}")
    ways, known = raw.get("ways"), paths.platform_names()
    if not isinstance(ways, list) or not ways or len(set(map(str, ways))) != len(ways):
        raise DtlabError(f"{where}.ways: must list the platforms that serve, each once (e.g. [ddp, ray]), "
                         f"got {ways!r}")
    for way in ways:
        if way not in known:
            raise DtlabError(f"{where}.ways: {way!r} is not a platform; choose from {', '.join(known)}")
    port = raw.get("port", DEFAULT_SERVE_PORT)
    if not isinstance(port, int) or isinstance(port, bool) or not 1024 <= port <= 65535:
        raise DtlabError(f"{where}.port: must be a TCP port 1024-65535, got {port!r}")
    load = LoadPlan.from_dict({key: value for key, value in raw.items() if key not in ("ways", "port")},
                              where)
    return ServeSpec(tuple(ways), load, port)


def search_cells(run: Mapping[str, Any], profile: str, trainer_options: Mapping[str, Any],
                 search: SearchSpec) -> Iterator[Cell]:
    """A search profile's run: seeds, then GPUs, then early stopping, then framework."""
    for seed in _as_list(run["seeds"]):
        for gpus in _as_list(run["gpus"]):
            for mode in _as_list(run.get(EARLY_STOPPING_KEY, "asha")):
                for framework in _as_list(run["frameworks"]):
                    yield Cell(framework=framework, gpus=gpus, epochs=search.budget_epochs, seed=seed,
                               profile=profile, trainer_config=trainer_options, task=f"search-{mode}",
                               task_plan=search.plan(mode))


def with_serve_cells(trained: Cell, serve: ServeSpec) -> Iterator[Cell]:
    """The trained cell, then one serve cell per way serving its checkpoint (the same options: the
    checkpoint's config hash is the served config's)."""
    yield trained
    for way in serve.ways:
        yield dataclasses.replace(trained, framework=way, task=SERVE_TASK, task_plan=serve.plan(trained))


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]
