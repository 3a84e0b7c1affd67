"""The report: the study's Tables 5.1-5.9 and Figure 5.1 regenerated from the results store,
side by side with the study's published figures (dtlab/data/study_results.yaml).

API (what dtlab.commands calls for `invoke bench.report` and `bench.all`)::

    from dtlab.report import generate_report, EmptyStoreError
    files = generate_report(results_dir, out_dir=None, profile=None, priorities=None)
    # priorities: parse_priorities("speed,recovery,operations") or a weights file (Table B.11)
    # results_dir: dtlab.paths.results_dir_for(cluster) or a ResultStore
    # out_dir:     default <results_dir>/report
    # -> ReportFiles(out_dir, markdown, html, csv=[...], figures=[...])
    # raises EmptyStoreError (a DtlabError with exit_code 1) when nothing is recorded at all

Partial stores give partial reports: a missing cell is shown as missing on either side. Failed
attempts are listed; only each cell's newest ok attempt of one profile (newest, or --profile) is used.
Rounding: see dtlab.report.numbers. Faulted cells (Cell.fault) are reported only in the "Fault recovery"
section (dtlab.report.faults: Report.faults, Table B.5, Figure B.2), beside their undisturbed twins.
The health gate that preceded the profile's matrix (results/<cluster>/gate/, written by bench.all) is
the "Health gate" section (dtlab.report.gate: Report.gate, Table B.6).
"""

from __future__ import annotations

import os
from pathlib import Path

from dtlab.paths import RESULTS_DIR
from dtlab.report.build import EmptyStoreError, Report, build_report, build_study_report
from dtlab.report.comparison import Priorities, parse_priorities
from dtlab.report.render import ReportFiles, write_report
from dtlab.results import ResultStore

REPORT_DIRNAME = "report"
STUDY_REPORT_DIR = RESULTS_DIR / "study-report"  # beside the clusters' folders, never inside one


def generate_report(
    results: str | os.PathLike[str] | ResultStore,
    out_dir: str | os.PathLike[str] | None = None,
    *,
    profile: str | None = None,
    priorities: Priorities | None = None,
) -> ReportFiles:
    store = results if isinstance(results, ResultStore) else ResultStore(results)
    report = build_report(store, profile=profile, priorities=priorities)
    return write_report(report, Path(out_dir) if out_dir is not None else store.root / REPORT_DIRNAME)


__all__ = [
    "STUDY_REPORT_DIR",
    "EmptyStoreError",
    "Priorities",
    "Report",
    "ReportFiles",
    "build_report",
    "build_study_report",
    "generate_report",
    "parse_priorities",
    "write_report",
]
