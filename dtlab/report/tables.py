"""The report's tables, one entry for the rest of the report: TableBuilder composes them by concern.

table_base: Table, config_label, the min-max notes and TableContext (the groups, the study, cell helpers);
study_tables: Tables 5.1-5.6 and the study's self-check; study_time_tables: Tables 5.7-5.9; own_tables:
B.1-B.4 and B.7; target_table: B.8, time to target; disagreements: B.9 and the set-up differences.
"""

from __future__ import annotations

from dtlab.report.disagreements import Disagreements, known_setup_differences
from dtlab.report.own_tables import OwnTables, ResumedCost, failures_table, resumed_table
from dtlab.report.study_tables import StudyTables, study_self_check
from dtlab.report.study_time_tables import StudyTimeTables
from dtlab.report.table_base import (
    SPREAD_NOTE,
    STUDY_SPREAD_NOTE,
    Table,
    TableContext,
    config_label,
    spread_text,
)
from dtlab.report.target_table import TIME_TO_TARGET_COLUMNS, TimeToTargetTable


class TableBuilder(StudyTables, StudyTimeTables, OwnTables, TimeToTargetTable, Disagreements):
    """Builds every table from this cluster's group statistics and the study's published figures."""


__all__ = [
    "SPREAD_NOTE",
    "STUDY_SPREAD_NOTE",
    "TIME_TO_TARGET_COLUMNS",
    "ResumedCost",
    "Table",
    "TableBuilder",
    "TableContext",
    "config_label",
    "failures_table",
    "known_setup_differences",
    "resumed_table",
    "spread_text",
    "study_self_check",
]
