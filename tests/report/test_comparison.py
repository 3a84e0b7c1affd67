"""Table B.10 (the study's qualitative comparison measured here) and Table B.11 (the recommendation
from the user's priorities), issue #28 items 4 and 5."""

import math
from dataclasses import replace
from datetime import UTC, datetime

import pytest
import yaml
from report_helpers import record_with_clock

from dtlab import commands, idle, provision
from dtlab.cell import Cell
from dtlab.cluster import SERVICE_VARIABLES
from dtlab.errors import DtlabError
from dtlab.paths import IDLE_DIRNAME, INVENTORY_DIR, PROVISION_DIRNAME, SITE_PLAYBOOK
from dtlab.report import build_report, build_study_report, parse_priorities
from dtlab.report.comparison import (
    CRITERIA,
    LAUNCHER_FILES,
    NOT_MEASURED,
    PLATFORM_ROLES,
    PLATFORMS,
    VARIABLE_PREFIXES,
    Measure,
    Priorities,
    better,
    check_study_conclusion,
    code_lines,
    moving_parts,
    rank,
    shared_roles,
)
from dtlab.results import ResultStore
from dtlab.roles import all_defaults

SEEDS = (1, 2, 3, 4, 5)
# What every host reads: group_vars/all.yml over the roles' defaults (a unit one role runs is named there).
GROUP_VARS = {**all_defaults(), **yaml.safe_load((INVENTORY_DIR / "group_vars" / "all.yml").read_text())}


def record(store, framework, seed, *, time_s, startup_s=10.0, accuracy=0.8, gpus=2, epochs=4):
    """One ok run with the whole-run clock: submitted at 1000, the first step `startup_s` later."""
    record_with_clock(store, Cell(framework, gpus, epochs, seed, "cmp"), time_s=time_s, startup_s=startup_s,
                      accuracy=accuracy, label=f"{framework} (CPU)", harness_time_s=time_s + 12)


def fill(store, times: dict[str, tuple[float, ...]], **options):
    for framework, framework_times in times.items():
        for seed, time_s in zip(SEEDS, framework_times, strict=False):
            record(store, framework, seed, time_s=time_s, **options.get(framework, {}))


def row(table, platform_name: str) -> dict[str, str]:
    found = [r for r in table.rows if r[0].text == platform_name]
    assert len(found) == 1, platform_name
    return dict(zip(table.columns, (v.text for v in found[0]), strict=True))


# --- computed columns ---------------------------------------------------------------------------------


def test_code_lines_leaves_out_blank_comment_and_docstring_lines():
    source = (
        '"""Module\ndocstring."""\n\n# a comment\nimport os  # trailing\n\n\ndef f():\n    """Doc."""\n'
        "    return (1,\n            2)\n"
    )
    assert code_lines(source) == 4  # import, def, and the two lines of the return


def test_comparison_table_columns_are_computed(tmp_path):
    store = ResultStore(tmp_path)
    fill(
        store,
        {"ddp": (100, 101, 102, 99, 98), "spark": (150, 151, 152, 149, 148)},
        spark={"startup_s": 40.0, "accuracy": 0.7},
    )
    comparison = build_report(store).comparison
    table = comparison.table
    assert table.number == "B.10"
    ddp, spark = row(table, "PyTorch DDP"), row(table, "Apache Spark")
    # Start-up: submit -> first step, per run; DDP 10 s on every run, Spark 40 s.
    assert ddp["Start-up: submit → first step"].startswith("10.00 s; 10.00–10.00 s (n=5)")
    assert spark["Start-up: submit → first step"].startswith("40.00 s")
    # Steady state: 4 epochs, mean 100 s -> 25.00 s/epoch; Spark +50% with its min-max against DDP's.
    assert ddp["Steady state: per epoch, overhead vs DDP"] == "25.00 s/epoch, – (baseline)"
    assert spark["Steady state: per epoch, overhead vs DDP"].startswith(
        "37.50 s/epoch, +50% vs DDP (+45–+55%"
    )
    assert "n=5/5" in spark["Steady state: per epoch, overhead vs DDP"]
    # Reproducible: Spark's runs reached 0.7, DDP's 0.8 with the same seeds: the epochs differ.
    assert spark["Reproducible: per-epoch accuracy = DDP's (same seed)"].startswith("no: differs")
    assert (
        row(table, "Ray Train")["Reproducible: per-epoch accuracy = DDP's (same seed)"]
        == "no same-seed DDP run"
    )
    # Lines: counted from the launchers, never typed in.
    for platform in PLATFORMS:
        counted = sum(code_lines((INVENTORY_DIR.parent / f).read_text()) for f in LAUNCHER_FILES[platform])
        assert comparison.measures["adoption"][platform].value == counted > 0
    # Services and ports: the inventory's names.
    determined = row(table, "Determined AI")
    assert determined["Services"] == ", ".join(
        GROUP_VARS[v] for v in ("determined_agent_service", "determined_master_service", "postgresql_service")
    )
    assert str(GROUP_VARS["determined_master_port"]) in determined["Listening ports"]
    assert ddp["Services"] == "none" and ddp["Listening ports"] == str(GROUP_VARS["dtlab_rendezvous_port"])
    ray_ports = row(table, "Ray Train")["Listening ports"]
    assert f"{GROUP_VARS['ray_min_worker_port']}–{GROUP_VARS['ray_max_worker_port']}" in ray_ports
    # No fault runs; no provisioning or idle record: the notes name the commands that record them.
    assert ddp["Recovery from a fault: total / undisturbed"] == "no fault run"
    assert ddp["Provisioning time"] == ddp["Idle memory / CPU per node"] == NOT_MEASURED
    assert any("invoke cluster.provision" in note and "provision/" in note for note in table.notes)
    assert any("invoke cluster.idle" in note and "idle/" in note for note in table.notes)


def test_same_seed_runs_with_equal_epochs_are_reproducible(tmp_path):
    store = ResultStore(tmp_path)
    fill(store, {"ddp": (100, 101, 102), "determined": (120, 121, 122)})
    comparison = build_report(store).comparison
    assert row(comparison.table, "Determined AI")["Reproducible: per-epoch accuracy = DDP's (same seed)"] == (
        "yes (3 same-seed runs equal DDP's)"
    )


def test_every_service_the_cluster_checks_belongs_to_one_platform():
    for variable in SERVICE_VARIABLES:
        owners = [p for p, prefixes in VARIABLE_PREFIXES.items() if variable.startswith(prefixes)]
        assert len(owners) == 1, variable
    assert sum(moving_parts(p, GROUP_VARS).count for p in PLATFORMS) > len(SERVICE_VARIABLES)


# --- provisioning time and idle use, from their records -------------------------------------------------


def converged(roles: dict[str, tuple[float, int]]) -> provision.ConvergeResult:
    """A successful converge whose roles took (seconds, changed results)."""
    timed = {name: provision.RoleTime(seconds, tasks=3, changed=changed, hosts={"node0": seconds})
             for name, (seconds, changed) in roles.items()}
    changed = {"node0": sum(c for _, c in roles.values())}
    return provision.ConvergeResult(0, "successful", {"changed": changed}, seconds=1.0, roles=timed)


def probed(units: list[tuple[str, str, str, str, float | None, float | None]]) -> idle.IdleMeasure:
    """An idle probe of (node, unit, platform, state, MiB, CPU %) rows."""
    return idle.IdleMeasure("c", "2026-11-25T10:00:00+00:00", 10.0, [
        idle.UnitIdle(node, unit, f"{platform}_service", platform, state,
                      None if mib is None else int(mib * 2**20), cpu,
                      running=(unit,) if state == "active" else ())
        for node, unit, platform, state, mib, cpu in units
    ])


def test_provisioning_and_idle_columns_come_from_their_records(tmp_path):
    store = ResultStore(tmp_path)
    fill(store, {"ddp": (100, 101, 102)})
    runs = [  # a first converge, then two idempotent re-runs, as dtlab.provision records them
        converged({"common": (40, 9), "spark": (100, 5), "ray": (50, 4), "postgresql": (20, 3),
                   "determined_master": (5, 0), provision.OUTSIDE_ROLES: (2, 0)}),
        converged({"common": (8, 0), "spark": (10, 0), "ray": (6, 0), "postgresql": (3, 0),
                   "determined_master": (1, 0)}),
        converged({"common": (9, 0), "spark": (12, 0), "ray": (7, 0), "postgresql": (4, 0),
                   "determined_master": (1, 0)}),
    ]
    for second, run in enumerate(runs):
        started = datetime(2026, 11, 25, 10, 0, second, tzinfo=UTC)
        provision.record_provision(run, "c", tmp_path / "hosts.yml", started, tmp_path / PROVISION_DIRNAME)
    probes = [
        probed([("node0", "dtlab-spark-master.service", "spark", "active", 300, 1.0),
                ("node1", "dtlab-spark-worker.service", "spark", "active", 200, 0.5),
                ("node0", "postgresql.service", "determined", "active", 25, 0.1),
                ("node1", "slurmd.service", "slurm", "inactive", None, None)]),
        probed([("node0", "dtlab-spark-master.service", "spark", "active", 310, 1.5),
                ("node1", "dtlab-spark-worker.service", "spark", "active", 200, 0.5),
                ("node0", "postgresql.service", "determined", "active", 25, None),
                ("node1", "slurmd.service", "slurm", "inactive", None, None)]),
    ]
    for second, probe in enumerate(probes):
        later = replace(probe, started_at=f"2026-11-25T10:00:0{second}+00:00")
        idle.record_idle(later, tmp_path / IDLE_DIRNAME)
    (tmp_path / IDLE_DIRNAME / "20261125T110000Z.json").write_text('{"format": 1, "units": "garbled"}')
    table = build_report(store).comparison.table
    spark, determined = row(table, "Apache Spark"), row(table, "Determined AI")
    # The first converge apart from the re-runs, min–max over those.
    assert spark["Provisioning time"] == "100 s with changes (1 run); 10–12 s changing nothing (n=2)"
    assert determined["Provisioning time"] == "25 s with changes (1 run); 4–5 s changing nothing (n=2)"
    assert row(table, "PyTorch DDP")["Provisioning time"].startswith("no role of its own")
    assert row(table, "Slurm")["Provisioning time"] == "its roles never ran"
    assert any("Shared roles ((outside roles), common): 42 s with changes (1 run); 8–9 s changing nothing "
               "(n=2)" in note for note in table.notes)
    # Idle: per node, min–max over the probes; a unit without a CPU figure is not read as 0 %.
    assert spark["Idle memory / CPU per node"] == (
        "node0: 300–310 MiB, 1.00–1.50% CPU; node1: 200 MiB, 0.50% CPU (n=2)")
    assert determined["Idle memory / CPU per node"] == "node0: 25 MiB, 0.10% CPU (n=2)"
    assert row(table, "Slurm")["Idle memory / CPU per node"] == "none running: slurmd.service inactive"
    assert row(table, "Ray Train")["Idle memory / CPU per node"] == "not installed"
    assert row(table, "PyTorch DDP")["Idle memory / CPU per node"] == "no daemon of its own"
    assert any(note.startswith("Left out, unreadable: idle/20261125T110000Z.json") for note in table.notes)
    assert not any("not measured" in note for note in table.notes)


def test_every_stage_role_of_site_yml_is_a_platforms_or_named_as_shared():
    # The roles site.yml's plays run; the roles they import (systemd_units, ...) count for them.
    stages = {role for _, roles in provision.playbook_plays(SITE_PLAYBOOK) for role in roles}
    owned = {role for platform_roles in PLATFORM_ROLES.values() for role in platform_roles}
    assert set(PLATFORM_ROLES) == set(PLATFORMS) and owned <= stages
    # A new stage lands here until it is placed in PLATFORM_ROLES or added to this list, knowingly.
    assert shared_roles(stages) == ["common", "docker", "firewall", "nvidia", "ssh", "trainer"]


# --- the ranking ---------------------------------------------------------------------------------------


def test_ranking_follows_only_supported_differences(tmp_path):
    store = ResultStore(tmp_path)
    # DDP and Spark overlap (within noise); Determined is slower than both beyond every run.
    fill(
        store,
        {
            "ddp": (100, 101, 102, 99, 98),
            "spark": (97, 104, 100, 101, 99),
            "determined": (130, 131, 132, 129, 128),
        },
    )
    comparison = build_report(store, priorities=parse_priorities("speed")).comparison
    places = {x.platform: x for x in rank(comparison, Priorities(("speed",)))}
    assert places["ddp"].rank == places["spark"].rank == 1
    assert places["determined"].rank == 3
    assert "not ranked against Apache Spark" in places["ddp"].reasons["speed"]
    # Ray and Slurm did not run: never placed, neither after the measured nor ahead of them.
    assert places["ray"].rank is None and places["slurm"].rank is None
    assert places["ray"].tiers == {"speed": None}
    recommendation = comparison.recommendation
    assert recommendation.number == "B.11"
    assert "PyTorch DDP and Apache Spark share first place" in recommendation.notes[0]
    # The next criterion breaks the tie: Spark's launcher is longer than DDP's.
    ordered = rank(comparison, Priorities(("speed", "adoption")))
    assert [x.platform for x in ordered[:2]] == ["ddp", "spark"] and ordered[1].rank == 2


def test_a_platform_that_did_not_recover_is_behind_one_that_did_whatever_the_runs():
    recovered = Measure(1.4, "1.40× undisturbed", (1.4,))
    lost = Measure(math.inf, "did not recover", (math.inf,))
    assert better(recovered, lost, lower_first=True) is True
    assert better(lost, recovered, lower_first=True) is False
    # Two recoveries of one run each: too few runs to tell apart.
    assert better(recovered, Measure(2.0, "2.00×", (2.0,)), lower_first=True) is None


def test_too_few_runs_rank_nobody_on_a_measured_time(tmp_path):
    store = ResultStore(tmp_path)
    fill(store, {"ddp": (100, 101), "determined": (300, 301)})
    comparison = build_report(store).comparison
    places = {x.platform: x.rank for x in rank(comparison, Priorities(("speed", "startup")))}
    assert places["ddp"] == places["determined"] == 1


def test_weights_decide_by_weighted_places(tmp_path):
    store = ResultStore(tmp_path)
    fill(store, {"ddp": (100, 101, 102), "determined": (130, 131, 132)}, determined={"startup_s": 5.0})
    comparison = build_report(store).comparison
    # Determined: #2 on speed, #1 on start-up (5 s against 10 s, every run); DDP the reverse.
    assert rank(comparison, Priorities(("startup", "speed"), {"startup": 3, "speed": 1}))[
        0
    ].platform == ("determined")
    assert rank(comparison, Priorities(("speed", "startup"), {"speed": 3, "startup": 1}))[
        0
    ].platform == ("ddp")


# --- priorities: parsing and one-line errors -------------------------------------------------------------


def test_priorities_parse_in_order_and_from_a_weights_file(tmp_path):
    assert parse_priorities("speed, recovery,operations") == Priorities(("speed", "recovery", "operations"))
    weights = tmp_path / "weights.yml"
    weights.write_text("recovery: 1\nspeed: 2.5\n")
    parsed = parse_priorities(str(weights))
    assert parsed.order == ("speed", "recovery") and parsed.weights == {"recovery": 1.0, "speed": 2.5}


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "unknown criterion 'fast'"),
        ("speed: [1\n", "not valid YAML at line"),
        ("- speed\n", "must map criteria to weights"),
        ("speed: -1\n", "speed: weight must be a number > 0"),
        ("price: 1\n", "unknown criterion 'price'"),
    ],
)
def test_bad_priorities_are_one_line_errors(tmp_path, content, expected):
    spec = "speed,fast"
    if content is not None:
        spec = str(tmp_path / "p.yml")
        (tmp_path / "p.yml").write_text(content)
    with pytest.raises(DtlabError) as error:
        parse_priorities(spec)
    message = str(error.value)
    assert expected in message and "\n" not in message and message.startswith("bench.report: --priorities")
    if content is None:
        assert all(c in message for c in CRITERIA)


def test_a_missing_priorities_file_and_an_empty_name_are_refused(tmp_path):
    with pytest.raises(DtlabError, match="cannot read it"):
        parse_priorities(str(tmp_path / "absent.yml"))
    with pytest.raises(DtlabError, match="separated by commas"):
        parse_priorities("speed,,recovery")


def test_bench_report_refuses_bad_priorities_before_writing(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(DtlabError, match="unknown criterion"):
        commands.bench_report(study=True, out=out, priorities="speed,vibes")
    assert not out.exists()


# --- the study's published figures ---------------------------------------------------------------------


def test_study_figures_reach_the_study_conclusion():
    report = build_study_report(parse_priorities("speed,recovery,operations"))
    comparison = report.comparison
    assert [t.number for t in comparison.study_tables] == ["5.10", "5.11"]
    assert comparison.platforms == ["ddp", "determined", "spark"]
    checks = comparison.conclusion_checks
    assert len(checks) == 3 and all(line.endswith("reproduced.") for line in checks)
    assert "PyTorch DDP for individual researchers prioritising speed" in checks[0]
    assert row(comparison.table, "Apache Spark")["Provisioning time"] == "not published"
    # Speed from the study's Table 5.9, ranked on its printed means and marked so.
    places = {x.platform: x for x in rank(comparison, Priorities(("speed",)))}
    assert [places[p].rank for p in ("ddp", "determined", "spark")] == [1, 2, 3]
    assert "spread not published" in places["determined"].reasons["speed"]
    assert comparison.recommendation.notes[0] == (
        "Recommended for speed, then recovery, then operations: PyTorch DDP."
    )


def test_a_conclusion_the_figures_do_not_support_is_named(monkeypatch):
    comparison = build_study_report().comparison
    # Were Spark's per-epoch time DDP's, speed alone would no longer single DDP out.
    speed = comparison.measures["speed"]
    monkeypatch.setitem(speed, "spark", type(speed["spark"])(speed["ddp"].value, "as DDP", published=True))
    checks = check_study_conclusion(comparison)
    assert checks[0].endswith("differs, computed first: PyTorch DDP and Apache Spark.")


def test_study_report_renders_the_comparison(tmp_path):
    files = commands.bench_report(study=True, out=tmp_path, priorities="checklist,speed")
    markdown = files.markdown.read_text()
    assert "Table 5.11: Cluster management features" in markdown
    assert "Recommendation for the priorities checklist, then speed" in markdown
    assert "Recommended for checklist, then speed: Determined AI." in markdown
    names = {p.name for p in files.csv}
    assert {
        "table-5.10-setup.csv",
        "table-5.11-management.csv",
        "table-b.10-comparison.csv",
        "table-b.11-recommendation.csv",
    } <= names
