"""The results store: every matrix cell's outcome, recorded once and never lost.

Layout, one folder per cluster (``dtlab.paths.results_dir_for(cluster_name)``)::

    results/<cluster>/
      dtlab.sqlite                        one row per attempt (SQLite, WAL, append-only)
      runs/<cell_key>/attempt-<n>/
        result.json                       the trainer's result (ok attempts)
        search.json                       a search cell's instead (ok attempts; trainer/search.py)
        serve.json                        a serve cell's instead: its load levels (dtlab/bench/serve.py)
        mlperf.log                        the same run in MLPerf's log format (ok attempts; mlperf_log)
        failure.json                      reason, node, exit code, log tail (failed attempts)
        logs/<node>.log                   per-node logs of that attempt

API (the harness, ``dtlab.bench``, is the writer; ``dtlab.report`` only reads)::

    from dtlab.cell import Cell
    from dtlab.results import ResultStore
    store = ResultStore.for_cluster("lab")            # or ResultStore(<results dir or .sqlite path>)
    cell = Cell("ddp", gpus=2, epochs=20, seed=3, profile="study", trainer_config={...})
    cell.key                                          # "ddp-g2-e20-s3": stable, file-name safe
    if not store.is_done(cell.key, config_hash):      # resume: an ok attempt with this hash exists?
        attempt = store.reserve_attempt(cell)         # Attempt(number, dir, log_dir): stream logs there
        ...run the cell...
        provenance = Provenance(config_hash=..., git_rev=..., inventory="lab",
                                node_versions={"node1": {...}}, log_dir=attempt.log_dir,
                                harness_time_s=123.4, attempt=attempt.number)
        store.record_ok(cell, result, provenance)
        # or on failure:
        store.record_failure(cell, provenance, reason="exit 1 on node2", node="node2", exit_code=1,
                             log_tail=[...])
    store.runs(status="ok")          # list[Run], oldest first; status=None for all, "failed" for failures
    store.latest_ok_runs(profile)    # one Run per cell key: its newest ok attempt (what the report uses)
    store.delete_all(confirm=True)   # the only way anything recorded goes away

Guarantees:
- Append-only: each attempt is a new row; SQLite triggers refuse UPDATE and DELETE on recorded
  runs, so a failure recorded after an ok result (or a ``--force`` rerun) adds, never replaces.
- Atomic: files are written to a temporary name and renamed; each row is one transaction, written
  after its files, so a crash leaves at most an unreferenced file, never a row without its JSON.
- Validated: an ok result must match ``trainer/result_schema.json`` and the cell (framework,
  epochs, seed) or ``record_ok`` raises ``DtlabError`` and records nothing.
- Attempt numbers are unique per cell key and allocated by the store (``reserve_attempt`` or
  ``attempt=None``); recording an attempt number that is already recorded raises ``DtlabError``.
"""

from __future__ import annotations

from dtlab.results.database import DB_FILENAME, RUNS_DIRNAME
from dtlab.results.records import (
    Attempt,
    Provenance,
    Run,
    newest_per_cell,
    result_strategy,
    unreadable_reason,
    validate_result,
)
from dtlab.results.schema import _DDL, _SCHEMA_VERSION
from dtlab.results.store import STATUSES, ResultStore

__all__ = ["DB_FILENAME", "RUNS_DIRNAME", "STATUSES", "Attempt", "Provenance", "ResultStore", "Run", "_DDL",
           "_SCHEMA_VERSION", "newest_per_cell", "result_strategy", "unreadable_reason", "validate_result"]
