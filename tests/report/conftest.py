"""Fixtures for the report tests (helpers live in report_helpers.py, a unique module name)."""

import pytest
from report_helpers import Lookup, fill_with_study_runs

from dtlab.results import ResultStore


@pytest.fixture(scope="session")
def study_store(tmp_path_factory) -> ResultStore:
    store = ResultStore(tmp_path_factory.mktemp("study-results"))
    fill_with_study_runs(store)
    return store


@pytest.fixture
def lookup():
    return Lookup
