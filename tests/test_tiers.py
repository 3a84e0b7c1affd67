"""The test tiers (dtlab/commands.py TIERS, the README's table): which lab and slow tests the default tier,
`invoke test`, keeps. The whole suite's collection comes from tests/conftest.py, before -m deselects."""

from pathlib import Path

import pytest
from _pytest.mark import MarkMatcher  # pytest's own -m evaluation, so the check and the selection agree
from _pytest.mark.expression import Expression

from dtlab.commands import DEFAULT_TIER_MARKERS, TIERS

TESTS_DIR = Path(__file__).parent

# The default tier's lab tests, one per capability it proves end to end (README, "Tests"). A new lab test
# belongs in the full tier; one that joins these has to be named here, with the capability it proves.
CORE_LAB_TESTS = {
    "tests/lab/test_lab.py::test_guard_blackholes_the_whole_lab_range_while_up": "the guard route",
    "tests/lab/test_lab.py::test_nodes_have_no_way_out_and_no_dns": "the lab is offline",
    "tests/provision/test_lab_converge.py::test_every_role_applies_on_every_node": "site.yml converges",
    "tests/provision/test_lab_converge.py::test_every_node_installed_from_the_bundle_alone": "the bundle",
    "tests/provision/test_firewall.py::test_an_outsider_on_the_network_reaches_ssh_and_no_other_port":
        "the firewall",
    "tests/harness/test_bench_lab.py::test_smoke_matrix_completes_every_cell_and_a_second_run_runs_nothing":
        "every platform's 2-worker cell, the same numbers",
    "tests/harness/test_bench_lab.py::test_a_killed_ddp_worker_resumes_from_its_checkpoint_to_the_undisturbed"
    "_numbers": "a killed worker resumed",
    "tests/harness/test_gate_lab.py::test_bench_all_on_nodes_that_do_not_answer_refuses_with_one_line_per_"
    "failure_and_writes_nothing": "bad input: a cluster that does not answer",
}


def in_default_tier(item) -> bool:
    return Expression.compile(DEFAULT_TIER_MARKERS).evaluate(MarkMatcher.from_markers(item.iter_markers()))


@pytest.fixture(scope="module")
def whole_suite(request):
    items = getattr(request.config, "dtlab_collected_items", [])
    given = {Path(request.config.rootpath, arg.split("::")[0]).resolve() for arg in request.config.args}
    if not given <= {TESTS_DIR.resolve(), request.config.rootpath.resolve()}:
        pytest.skip(f"this session collects part of the suite ({' '.join(request.config.args)}); the tiers "
                    "are checked on the whole of tests/")
    return items


def selected_by(selection: str, item) -> bool:
    """Whether one pass of TIERS (its `-m '...'`) selects the collected `item`."""
    expression = selection.split("-m '")[1].split("'")[0]
    return Expression.compile(expression).evaluate(MarkMatcher.from_markers(item.iter_markers()))


def test_each_tiers_passes_run_its_tests_each_once(whole_suite):
    # The full tier: the quick tests first on every core, then the lab's and slow ones in one process; the
    # default tier in one process, its quick tests beside the lab's preparation (commands.TIERS).
    assert TIERS["default"] == (f"-m '{DEFAULT_TIER_MARKERS}'",)
    assert TIERS["all"][0] == TIERS["fast"][0] and TIERS["all"][0].endswith(" -n auto")
    assert " -n " not in TIERS["all"][1]
    for tier, passes in TIERS.items():
        quick = lambda item: not (item.get_closest_marker("lab") or item.get_closest_marker("slow"))  # noqa: E731
        wanted = {"fast": quick, "default": in_default_tier, "all": lambda item: True}[tier]
        for item in whole_suite:
            runs = sum(selected_by(selection, item) for selection in passes)
            assert runs == (1 if wanted(item) else 0), (tier, item.nodeid, runs)


def test_core_is_only_on_lab_or_slow_tests(whole_suite):
    misplaced = [item.nodeid for item in whole_suite if item.get_closest_marker("core")
                 and not (item.get_closest_marker("lab") or item.get_closest_marker("slow"))]
    assert misplaced == [], "core picks lab or slow tests for the default tier; these are in it anyway"


def test_every_lab_test_is_in_exactly_one_tier(whole_suite):
    lab = [item for item in whole_suite if item.get_closest_marker("lab")]
    default = {item.nodeid for item in lab if in_default_tier(item)}
    full_only = {item.nodeid for item in lab if not in_default_tier(item)}
    assert default | full_only == {item.nodeid for item in lab} and not default & full_only
    # In the default tier exactly when marked core: a lab test with neither core nor slow is in the full
    # tier too (tests/lab/test_lab.py's are lab alone).
    assert default == {item.nodeid for item in lab if item.get_closest_marker("core")}
    core = {item.nodeid.split("[")[0] for item in lab if item.get_closest_marker("core")}
    assert core == set(CORE_LAB_TESTS)
    assert len(full_only) > len(default)


def test_every_other_test_that_is_neither_lab_nor_slow_stays_in_the_default_tier(whole_suite):
    plain = [item for item in whole_suite
             if not (item.get_closest_marker("lab") or item.get_closest_marker("slow"))]
    assert plain and all(in_default_tier(item) for item in plain)
    slow_default = [item for item in whole_suite if item.get_closest_marker("slow") and in_default_tier(item)]
    assert all(item.get_closest_marker("core") for item in slow_default)
