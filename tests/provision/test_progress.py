"""invoke demo shows the converge as it runs: ansible-runner's events, one line per play and task."""

import json
import textwrap
from datetime import UTC, datetime

import pytest

from dtlab import paths, provision


@pytest.mark.slow
def test_converge_reports_each_play_task_and_outcome_as_it_runs(tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(textwrap.dedent("""\
        all:
          vars: {ansible_connection: local, ansible_python_interpreter: "{{ ansible_playbook_python }}",
                 dtlab_cluster_name: progress}
          children:
            master: {hosts: {m: {ansible_host: 127.0.70.1}}}
            workers: {hosts: {w: {ansible_host: 127.0.70.2}}}
        """))
    playbook = tmp_path / "play.yml"
    playbook.write_text(textwrap.dedent("""\
        - name: Two steps
          hosts: all
          gather_facts: false
          tasks:
            - name: Say hello
              ansible.builtin.debug: {msg: hello}
            - name: Change something on the master only
              ansible.builtin.command: "true"
              changed_when: inventory_hostname == 'm'
        """))
    lines: list[str] = []
    result = provision.converge(inventory, playbook=str(playbook), progress=lines.append)
    assert result.ok, result.output[-2000:]
    steps = [line.split("] ", 1)[1] for line in lines]
    assert steps == ["PLAY Two steps", "  TASK Say hello", "       ok: m w",
                     "  TASK Change something on the master only", "       changed: m; ok: w"], lines
    assert all(line.startswith("[") and "s] " in line for line in lines), "each line has the elapsed time"
    quiet = provision.converge(inventory, playbook=str(playbook))
    assert quiet.ok and quiet.changed_hosts == {"m": 1}, "without progress the run is silent, same recap"


# --- seconds per role, from the same events ---------------------------------------------------------

def event(kind, created, role=None, host=None, duration=None, changed=False):
    """An event as ansible-runner hands it to the handler (fields as recorded from a real run)."""
    data = {"role": role, "task": "t"}
    if host is not None:
        data |= {"host": host, "duration": duration, "res": {"changed": changed}}
    return {"event": kind, "created": f"2026-11-25T09:56:{created:09.6f}+00:00", "event_data": data}


# Recorded from a run of a play with one task outside roles, role `hello` (a 2 s command that changes
# m, a loop of two items) and its handler; trimmed to the kinds the timer reads or must ignore.
RECORDED = [
    event("playbook_on_start", 1.274405),
    event("playbook_on_play_start", 1.277438),
    event("playbook_on_task_start", 1.289109, "hello"),
    event("runner_on_start", 1.295200, "hello", "m"),
    event("runner_on_ok", 3.335701, "hello", "w", 2.02905),
    event("runner_on_ok", 3.370944, "hello", "m", 2.075562, changed=True),
    event("playbook_on_task_start", 3.373183, "hello"),
    event("runner_item_on_ok", 3.421372, "hello", "m", None),
    event("runner_on_ok", 3.449489, "hello", "m", 0.07517),
    event("runner_on_ok", 3.462259, "hello", "w", 0.065183),
    event("playbook_on_task_start", 3.465505),
    event("runner_on_ok", 3.515708, None, "m", 0.049042),
    event("runner_on_failed", 3.525588, None, "w", 0.034228),
    event("playbook_on_handler_task_start", 3.539860, "hello"),
    event("runner_on_ok", 3.575200, "hello", "m", 0.034187),
    event("playbook_on_stats", 3.588502),
]


def test_role_timer_adds_each_task_to_its_role_from_the_event_times():
    timer = provision.RoleTimer(clock=lambda: pytest.fail("every event has its time"))
    assert all(timer(e) is True for e in RECORDED), "the events stay in the runner's artifacts"
    hello, outside = timer.roles["hello"], timer.roles[provision.OUTSIDE_ROLES]
    # Wall time: each task's start to the next start (the handler's too), counted once for all hosts.
    # (UTC timestamps of 2026 as floats: microseconds, give or take a few)
    assert hello.seconds == pytest.approx((3.465505 - 1.289109) + (3.588502 - 3.539860), abs=1e-5)
    assert outside.seconds == pytest.approx(3.539860 - 3.465505, abs=1e-5)
    assert (hello.tasks, outside.tasks) == (3, 1)
    assert (hello.changed, outside.changed) == (1, 0)
    # Per host: Ansible's own duration of each result; a loop's items are not counted twice.
    assert hello.hosts == pytest.approx({"m": 2.075562 + 0.07517 + 0.034187, "w": 2.02905 + 0.065183})
    assert outside.hosts == pytest.approx({"m": 0.049042, "w": 0.034228})


def test_a_plays_tasks_count_for_its_one_role_with_the_roles_it_imports():
    timer = provision.RoleTimer({"Spark standalone": "spark"})
    in_play = [
        event("playbook_on_task_start", 10.0),  # fact gathering: no role
        event("runner_on_ok", 11.0, None, "node0", 0.9),
        event("playbook_on_task_start", 11.0, "spark"),
        event("runner_on_ok", 14.0, "spark", "node0", 2.9, changed=True),
        event("playbook_on_task_start", 14.0, "systemd_units"),  # imported by spark
        event("runner_on_ok", 15.5, "systemd_units", "node0", 1.4, changed=True),
        event("playbook_on_stats", 16.0),
    ]
    for e in in_play:
        e["event_data"]["play"] = "Spark standalone"
        timer(e)
    timer(event("playbook_on_task_start", 16.0, "common") | {"event_data": {"role": "common", "play": "?"}})
    assert set(timer.roles) == {"spark", "common"}, "a play of no known role: the task's own role"
    spark = timer.roles["spark"]
    assert spark.seconds == pytest.approx(6.0, abs=1e-5) and spark.tasks == 3 and spark.changed == 2
    assert spark.imported == {"systemd_units": pytest.approx(2.0, abs=1e-5)}
    assert spark.hosts == {"node0": pytest.approx(0.9 + 2.9 + 1.4)}


def test_play_roles_reads_the_imported_playbooks_and_leaves_out_the_ambiguous(tmp_path):
    (tmp_path / "stages").mkdir()
    (tmp_path / "stages" / "a.yml").write_text(
        "- name: A\n  hosts: all\n  roles: [{role: alpha}]\n"
        "- name: Two\n  hosts: all\n  roles: [alpha, beta]\n"
        "- name: Same\n  hosts: all\n  roles: [alpha]\n")
    (tmp_path / "site.yml").write_text(
        "- name: Import\n  ansible.builtin.import_playbook: stages/a.yml\n"
        "- name: Tasks only\n  hosts: all\n  tasks: [{ansible.builtin.debug: {msg: x}}]\n"
        "- name: Same\n  hosts: all\n  roles: [gamma]\n"
        "- name: B\n  hosts: all\n  roles: [beta]\n")
    assert provision.play_roles(tmp_path / "site.yml") == {"A": "alpha", "B": "beta"}
    assert provision.play_roles(tmp_path / "missing.yml") == {}
    site = provision.play_roles(paths.SITE_PLAYBOOK)
    assert {"spark", "ray", "slurm", "common"} <= set(site.values()), site


def test_role_timer_uses_its_clock_for_an_event_without_a_time():
    ticks = iter([10.0, 14.5])
    timer = provision.RoleTimer(clock=lambda: next(ticks))
    timer({"event": "playbook_on_task_start", "event_data": {"role": "spark"}})
    timer({"event": "playbook_on_stats", "created": "not a time", "event_data": {}})
    assert timer.roles["spark"].seconds == 4.5


@pytest.mark.parametrize(("playbook", "options", "recorded"), [
    ("site.yml", {}, True),
    (str(paths.SITE_PLAYBOOK), {}, True),
    ("site.yml", {"check": True}, False),
    ("site.yml", {"tags": ["spark"]}, False),
    ("site.yml", {"limit": "node1"}, False),
    ("tests/provision/playbooks/spark_release.yml", {}, False),
])
def test_only_a_whole_real_site_run_is_recorded(playbook, options, recorded):
    chosen = {"check": False, "tags": (), "limit": None} | options
    assert provision.whole_site_run(playbook, **chosen) is recorded


def test_the_record_holds_seconds_per_role_and_whether_anything_changed(tmp_path):
    timer = provision.RoleTimer()
    for e in RECORDED:
        timer(e)
    result = provision.ConvergeResult(0, "successful", {"changed": {"m": 1, "w": 0}}, seconds=4.2,
                                      roles=timer.roles)
    started = datetime(2026, 11, 25, 9, 56, 1, 274405, tzinfo=UTC)
    path = provision.record_provision(result, "c", tmp_path / "hosts.yml", started, tmp_path / "provision")
    assert path == tmp_path / "provision" / "20261125T095601274405Z.json"
    content = json.loads(path.read_text())
    assert content["format"] == provision.PROVISION_FORMAT and content["cluster"] == "c"
    assert content["changed"] is True and content["changed_per_host"] == {"m": 1}
    assert content["roles"]["hello"]["seconds"] == pytest.approx(2.225, abs=1e-3)
    assert content["roles"]["hello"]["changed"] == 1
    assert set(content["roles"]["hello"]["hosts"]) == {"m", "w"}
    unchanged = provision.ConvergeResult(0, "successful", {"changed": {"m": 0}}, roles=timer.roles)
    again = provision.record_provision(unchanged, "c", tmp_path, datetime.now(UTC), tmp_path / "provision")
    assert json.loads(again.read_text())["changed"] is False
    assert sorted(p.name for p in (tmp_path / "provision").iterdir()) == sorted([path.name, again.name])


@pytest.mark.slow
def test_a_real_run_times_its_roles_and_records_nothing_but_site_yml(tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(textwrap.dedent("""\
        all:
          vars: {ansible_connection: local, ansible_python_interpreter: "{{ ansible_playbook_python }}",
                 dtlab_cluster_name: roletimes}
          children:
            master: {hosts: {m: {ansible_host: 127.0.70.1}}}
            workers: {hosts: {w: {ansible_host: 127.0.70.2}}}
        """))
    for role, body in (("waiting", "- name: Wait a second\n  ansible.builtin.command: sleep 1\n"
                                   "- name: Its helper\n  ansible.builtin.import_role: {name: helper}\n"),
                       ("helper", "- name: Wait another second\n  ansible.builtin.command: sleep 1\n")):
        (tmp_path / "roles" / role / "tasks").mkdir(parents=True)
        (tmp_path / "roles" / role / "tasks" / "main.yml").write_text(body)
    playbook = tmp_path / "play.yml"
    playbook.write_text("- name: One role\n  hosts: all\n  gather_facts: false\n  roles: [waiting]\n")
    result = provision.converge(inventory, playbook=str(playbook))
    assert result.ok, result.output[-2000:]
    assert set(result.roles) == {"waiting"}, "the imported helper's time is the role's that imports it"
    waiting = result.roles["waiting"]
    assert 2.0 <= waiting.seconds < result.seconds and waiting.changed == 4
    assert 1.0 <= waiting.imported["helper"] < waiting.seconds
    assert set(waiting.hosts) == {"m", "w"} and all(s >= 2.0 for s in waiting.hosts.values())
    assert result.record is None, "not site.yml: no provisioning time recorded"
    assert not (paths.results_dir_for("roletimes")).exists()
