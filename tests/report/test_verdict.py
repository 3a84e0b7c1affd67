"""The verdict on the report's first screen (issue #52, items 1 and 6): one line per scenario from
experiments/scenarios.yml, decided only where the spread supports it, otherwise "not decidable yet" with the
command that would decide it and how long that took here."""

import pytest
import yaml
from report_helpers import record_with_clock

from dtlab import matrix
from dtlab.cell import Cell
from dtlab.errors import DtlabError
from dtlab.report import build_report, generate_report
from dtlab.report.comparison import Priorities, rank
from dtlab.report.recommendation import MEASURED_BY, decide
from dtlab.report.verdict import SCENARIOS_FILE, build_verdict, load_scenarios
from dtlab.results import ResultStore

OFF_CLUSTER = "determined (Core API, off-cluster)"


def record(store, framework, seed, *, time_s, startup_s=10.0, profile="spread", label=None):
    """One ok 2-worker, 2-epoch CPU run with the whole-run clock: its first step `startup_s` after submit."""
    record_with_clock(store, Cell(framework, 2, 2, seed, profile), time_s=time_s, startup_s=startup_s,
                      label=label or f"{framework} (CPU)", harness_time_s=time_s + 12)


def fill(store, runs: dict[str, list[float]], **options):
    for framework, times in runs.items():
        for seed, time_s in enumerate(times, start=1):
            record(store, framework, seed, time_s=time_s, **options.get(framework, {}))


def scenarios_file(tmp_path, *entries) -> list:
    path = tmp_path / "scenarios.yml"
    path.write_text(yaml.safe_dump({"scenarios": list(entries)}, sort_keys=False))
    return load_scenarios(path)


def scenario(id_, priorities, candidates=None, speed="steady_state", claim="ddp"):
    entry = {"id": id_, "name": f"Scenario {id_}", "source": "a test", "claim": claim, "speed": speed,
             "priorities": priorities}
    if candidates:
        entry |= {"candidates": candidates, "because": "the test says so"}
    return entry


def lines(report, scenarios, store=None, priorities=None) -> dict[str, str]:
    runs = store.runs(status=None) if store is not None else []
    verdict = build_verdict(report.comparison, report.groups, runs, priorities, scenarios)
    return dict(verdict.lines)


# --- decided, and not decidable yet -------------------------------------------------------------------


@pytest.fixture
def mixed_store(tmp_path):
    """DDP and Spark 5 runs each, Spark slower beyond every run; Ray and Slurm one run each."""
    store = ResultStore(tmp_path / "results")
    fill(store, {"ddp": [100, 101, 102, 99, 98], "spark": [150, 151, 152, 149, 148],
                 "ray": [120], "slurm": [125]})
    return store


def test_one_scenario_is_decided_and_one_is_not(mixed_store, tmp_path):
    report = build_report(mixed_store)
    chosen = scenarios_file(tmp_path, scenario("clear", ["speed", "adoption"], ["ddp", "spark"]),
                            scenario("single", ["speed", "adoption"], ["ray", "slurm"], claim="ray"))
    found = lines(report, chosen, mixed_store)
    clear = found["Scenario clear (speed: the steady-state epoch; admits PyTorch DDP and Apache Spark: the "
                  "test says so)"]
    assert clear.startswith("favours PyTorch DDP: steady-state speed: 50.00 s/epoch (n=5) against "
                            "Apache Spark's 75.00 s/epoch (n=5)")
    assert "How sure: supported: min–max apart with at least 5 runs each" in clear
    assert "The source's pick (a test): PyTorch DDP, the runs here agree" in clear
    single = [answer for who, answer in found.items() if who.startswith("Scenario single")][0]
    assert single.startswith("not decidable yet: steady-state speed rests on 1 run (at least 3 each are "
                             "needed) for Ray Train and Slurm. Decide it with "
                             "`invoke bench.all --profile spread`")
    # The spread profile's runs are in this store: how long they took here is said, from the record
    # (harness time: 12 s beyond each trainer span: 5 x (100+12) ... summed over the 12 runs).
    seconds = sum(t + 12 for t in [100, 101, 102, 99, 98, 150, 151, 152, 149, 148, 120, 125])
    assert f"(its 12 cells took {seconds / 60:.1f} min of cell time here (recorded))" in single
    assert "favours" not in single


def test_the_verdict_is_on_the_first_screen_before_any_table(mixed_store, tmp_path):
    files = generate_report(mixed_store, tmp_path / "report")
    markdown = files.markdown.read_text()
    verdict = markdown.index("## Verdict")
    assert verdict < markdown.index("\n|") and verdict < markdown.index("**Table")
    scenario_a = markdown.index("**Scenario A: multi-GPU training of a medium model, long jobs")
    assert scenario_a < markdown.index("\n|")
    html = files.html.read_text()
    assert html.index('<section id="verdict">') < html.index("<table")
    assert "<code>invoke bench.faults --profile faults</code>" in html
    # Item 3: dtlab's own tables are named by what they show, their number an anchor after it; the
    # study's keep its numbering first.
    assert "**Throughput, GPU utilisation and harness time (beyond the study)** (Table B.1; [CSV]" in markdown
    assert "**Table 5.1: " in markdown and "**Table B.1:" not in markdown
    assert ">Throughput, GPU utilisation and harness time (beyond the study) <small>Table B.1 ·" in html


# --- a criterion with no runs behind it ---------------------------------------------------------------


def test_an_unmeasured_criterion_stops_the_decision_and_names_its_profile(mixed_store, tmp_path):
    report = build_report(mixed_store)
    chosen = scenarios_file(tmp_path, scenario("resilient", ["recovery", "speed"], ["ddp", "spark"]))
    [answer] = lines(report, chosen, mixed_store).values()
    # Speed would separate DDP from Spark, but recovery comes first and no fault run is recorded:
    # speed must not decide as if recovery were measured and tied.
    assert answer.startswith("not decidable yet: recovery is not measured for PyTorch DDP and Apache Spark. "
                             "Decide it with `invoke bench.faults --profile faults`")
    assert "not yet run on this cluster, so its duration is not measured here" in answer
    # What it took on the local lab, measured alone (dtlab/data/lab_durations.yml), for a newcomer's report.
    assert "; on the local lab the command took 4 min (2026-12-01, one run each, alone on a 2-core machine)" \
        in answer
    assert "favours" not in answer
    decision = decide(report.comparison.measures, Priorities(("recovery", "speed")), ["ddp", "spark"])
    assert decision.chosen == () and decision.blocked == "recovery"


def test_every_command_the_verdict_names_runs_a_profile_the_matrix_declares():
    for command, profile in MEASURED_BY.values():
        if profile is not None:
            assert f"--profile {profile}" in command
            assert matrix.load(profile).cells


# --- the study's checklist, platforms the study did not cover ------------------------------------------


def test_a_platform_the_study_did_not_cover_is_not_ranked_last_for_it(tmp_path):
    store = ResultStore(tmp_path / "results")
    fill(store, {"ddp": [100, 101, 102], "determined": [130, 131, 132], "ray": [60, 61, 62]})
    comparison = build_report(store).comparison
    # The study's checklist ranks no one here: Determined's 7 of 7 is shown, valued None.
    assert all(not m.measured for m in comparison.measures["checklist"].values())
    assert comparison.measures["checklist"]["determined"].shown.startswith("7 of 7 (Table 5.11")
    places = {x.platform: x for x in rank(comparison, Priorities(("checklist", "speed")))}
    assert places["ray"].tiers["checklist"] is None
    assert places["ray"].rank <= places["determined"].rank, "never after the others for the study alone"
    assert places["ray"].rank == 1  # ahead on speed, the one measured criterion
    decided = decide(comparison.measures, Priorities(("speed", "checklist")), ["ddp", "determined", "ray"])
    assert decided.chosen == ("ray",)
    chosen = scenarios_file(tmp_path, scenario("fast", ["speed", "footprint"], claim="determined"))
    [answer] = lines(build_report(store), chosen).values()
    assert answer.startswith("favours Ray Train: steady-state speed: 30.50 s/epoch (n=3) against")


# --- stand-ins and upstream health ----------------------------------------------------------------------


def test_a_recommendation_resting_on_a_stand_in_says_so_with_upstream_health(tmp_path):
    store = ResultStore(tmp_path / "results")
    fill(store, {"ddp": [100, 101, 102], "determined": [60, 61, 62]},
         determined={"label": OFF_CLUSTER})
    chosen = scenarios_file(tmp_path, scenario("fast", ["speed"], claim="ddp"))
    [answer] = lines(build_report(store), chosen).values()
    assert answer.startswith("favours Determined AI")
    assert f'Rests on a stand-in: Determined AI\'s runs here are "{OFF_CLUSTER}"' in answer
    assert "Determined AI is unmaintained upstream (last release 0.38.1, 19 March 2025" in answer
    table = build_report(store).comparison.table
    [horovod] = [row for row in table.rows if row[0].text == "Horovod"]
    assert horovod[-1].text.startswith("unmaintained; last release: 0.28.1, 12 June 2023")


# --- the demo's single runs ----------------------------------------------------------------------------


def test_single_runs_say_what_they_can_and_cannot_show(tmp_path):
    store = ResultStore(tmp_path / "results")
    fill(store, {p: [100.0] for p in ("ddp", "spark", "determined", "ray", "slurm", "horovod")},
         **{p: {"profile": "smoke"} for p in ("ddp", "spark", "determined", "ray", "slurm", "horovod")})
    report = build_report(store)
    assert report.verdict is not None
    [preface] = report.verdict.preface
    assert preface.startswith("These are 6 single runs, one per cell.")
    assert "They cannot rank platforms on any time: one run has no spread" in preface
    for who, answer in report.verdict.lines:
        if "not decidable yet" in answer:
            assert "Decide it with `invoke bench." in answer, who
            assert "not yet run on this cluster, so its duration is not measured here" in answer, who
    assert sum("not decidable yet" in answer for _who, answer in report.verdict.lines) >= 4
    # With five runs per cell, no such preface.
    assert build_report(ResultStore(tmp_path / "results"), profile="smoke").verdict.preface
    five = ResultStore(tmp_path / "five")
    fill(five, {"ddp": [100, 101, 102, 99, 98]})
    assert build_report(five).verdict.preface == []


def test_your_priorities_come_first(mixed_store):
    report = build_report(mixed_store, priorities=Priorities(("speed",)))
    who, answer = report.verdict.lines[0]
    assert who == "Your priorities (speed)"
    # Ray and Slurm ran once each: speed cannot place them, so nothing is decided for all four.
    assert answer.startswith("not decidable yet: steady-state speed rests on 1 run")


# --- the scenarios file --------------------------------------------------------------------------------


def test_the_shipped_scenarios_file_loads():
    found = load_scenarios()
    assert SCENARIOS_FILE.name == "scenarios.yml"
    assert {s.id for s in found} >= {"researchers", "shared", "pipelines", "scenario-a", "scenario-b",
                                     "scenario-c"}
    assert {s.speed for s in found} == {"whole_run", "steady_state"}


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("scenarios: [\n", "not valid YAML at line"),
        ("other: 1\n", "needs `scenarios:`"),
        ({"speed": "fast"}, "speed must be whole_run or steady_state, got 'fast'"),
        ({"priorities": ["speed", "vibes"]}, "unknown criterion 'vibes'"),
        ({"priorities": ["speed", "speed"]}, "a criterion is named twice"),
        ({"weights": {"speed": 0}}, "speed: weight must be a number > 0"),
        ({"claim": "mpi"}, "claim: platforms are ddp"),
        ({"colour": "red"}, "unknown key 'colour'"),
    ],
)
def test_a_bad_scenarios_file_is_one_line(tmp_path, content, expected):
    path = tmp_path / "scenarios.yml"
    if isinstance(content, str):
        path.write_text(content)
    else:
        entry = scenario("x", ["speed"]) | content
        if "weights" in content:
            entry.pop("priorities")
        path.write_text(yaml.safe_dump({"scenarios": [entry]}))
    with pytest.raises(DtlabError) as error:
        load_scenarios(path)
    message = str(error.value)
    assert expected in message and "\n" not in message and str(path) in message
