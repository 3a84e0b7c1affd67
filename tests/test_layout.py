"""The test tree itself: pytest's default import mode imports a test file outside a package by its
basename, so two such files with one name stop the whole suite at collection (it happened once)."""

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).parent


def test_test_files_outside_packages_have_unique_basenames():
    by_name = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        if not (path.parent / "__init__.py").exists():
            by_name[path.name].append(str(path.relative_to(TESTS)))
    assert len(by_name) > 10  # the walk found the suite
    assert {name: paths for name, paths in by_name.items() if len(paths) > 1} == {}
