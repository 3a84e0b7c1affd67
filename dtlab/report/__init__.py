"""The report: the study's Tables 5.1-5.9 and Figure 5.1 regenerated from the results store,
side by side with the study's published figures (dtlab/data/study_results.yaml).

API (what `invoke bench.report` and `bench.all` call)::

    from dtlab.report import generate_report, EmptyStoreError
    files = generate_report(results_dir, out_dir=None, profile=None)
    # results_dir: dtlab.paths.results_dir_for(cluster) or a ResultStore
    # out_dir:     default <results_dir>/report
    # -> ReportFiles(out_dir, markdown, html, csv=[...], figures=[...])
    # raises EmptyStoreError (a DtlabError with exit_code 1) when nothing is recorded at all

Partial stores give partial reports: a missing cell is shown as missing on either side. Failed
attempts are listed; only each cell's newest ok attempt of one profile (newest, or --profile) is used.
Rounding: see dtlab.report.numbers.
"""

from __future__ import annotations

import os
from pathlib import Path

from dtlab.errors import DtlabError
from dtlab.paths import RESULTS_DIR
from dtlab.report.build import EmptyStoreError, Report, build_report, build_study_report
from dtlab.report.render import ReportFiles, write_report
from dtlab.results import ResultStore

REPORT_DIRNAME = "report"
STUDY_REPORT_DIR = RESULTS_DIR / "study-report"  # beside the clusters' folders, never inside one


def generate_report(
    results: str | os.PathLike[str] | ResultStore,
    out_dir: str | os.PathLike[str] | None = None,
    *,
    profile: str | None = None,
) -> ReportFiles:
    store = results if isinstance(results, ResultStore) else ResultStore(results)
    report = build_report(store, profile=profile)
    return write_report(report, Path(out_dir) if out_dir is not None else store.root / REPORT_DIRNAME)


__all__ = [
    "EmptyStoreError",
    "Report",
    "ReportFiles",
    "build_report",
    "build_study_report",
    "generate_report",
    "report_command",
    "write_report",
]


def report_command(
    *,
    inventory: str | None = None,
    results_dir: str | os.PathLike[str] | None = None,
    out: str | os.PathLike[str] | None = None,
    profile: str | None = None,
    study: bool = False,
) -> ReportFiles:
    """`invoke bench.report`: resolve the results folder, write the report, print where it went.

    An empty store raises EmptyStoreError (one line, exit 1: there is no report to read). Bad input
    raises DtlabError (exit 2). With `study`, the
    report is rendered from the study's published runs alone (default folder results/study-report).
    """
    if study:
        if results_dir is not None or profile is not None or inventory is not None:
            raise DtlabError("bench.report: --study reads only the study's published runs; "
                             "leave out --inventory, --results-dir and --profile")
        files = write_report(build_study_report(), Path(out) if out is not None else STUDY_REPORT_DIR)
        _print_written(files)
        return files
    if results_dir is None:
        from dtlab.inventory import load_cluster
        from dtlab.paths import results_dir_for

        # Only the cluster's name is read, no node is contacted: the example's placeholder addresses pass.
        results_dir = results_dir_for(load_cluster(inventory, allow_placeholders=True).name)
    files = generate_report(results_dir, out, profile=profile)
    _print_written(files)
    return files


def _print_written(files: ReportFiles) -> None:
    print(f"report: {files.markdown}")
    print(f"        {files.html}")
    print(f"        {len(files.csv)} CSV tables in {files.csv[0].parent}, {len(files.figures)} figure files")
