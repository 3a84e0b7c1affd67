"""cluster.check and cluster.reset find the provisioned services by the names the inventory gives them."""

import subprocess

from harness_helpers import CPU_CLUSTER_3, write_inventory

from dtlab import cluster as cluster_module
from dtlab import platforms, remote
from dtlab.platforms import load_cluster
from dtlab.platforms.base import ResetSteps, restart_command

# A unit file every machine with systemd has (the controller needs systemd-container for the lab).
INSTALLED_UNIT = "systemd-journald"
MISSING_UNIT = "dtlab-no-such-service"


def _cluster_naming(tmp_path, **services):
    site = "dtlab_device: cpu\ndtlab_cluster_name: three\ndetermined_install_binaries: true\n"
    site += "".join(f"{variable}: {unit}\n" for variable, unit in services.items())
    return load_cluster(write_inventory(tmp_path, CPU_CLUSTER_3, group_vars={"all": site}))


def test_every_service_name_is_read_from_the_inventory(tmp_path):
    renamed = {name: f"site-{name.replace('_', '-')}" for name in cluster_module.SERVICE_VARIABLES}
    cluster = _cluster_naming(tmp_path, **renamed)
    assert cluster_module._service_units(cluster) == renamed
    script = cluster_module._probe_script(cluster, cluster.master)
    assert all(unit in script for unit in renamed.values())


def test_the_probe_reports_an_installed_service_and_is_silent_about_a_missing_one(tmp_path):
    cluster = _cluster_naming(tmp_path, spark_master_service=INSTALLED_UNIT, postgresql_service=MISSING_UNIT)
    # The probe script itself, run here: list-unit-files reads unit files, no running systemd needed.
    answer = subprocess.run(
        ["sh", "-c", cluster_module._probe_script(cluster, cluster.master)],
        capture_output=True, text=True, timeout=60,
    )
    values = cluster_module._parse_probe(answer.stdout)
    assert f"service.{INSTALLED_UNIT}" in values
    assert f"service.{MISSING_UNIT}" not in values
    assert float(values["time_end"]) >= float(values["time"]) > 0  # the script's own time, for the skew


def test_the_skew_leaves_out_the_nodes_own_script_time():
    # A node 2 s ahead whose script runs 3 s (its systemctl calls on a loaded node), network 0.1 s each
    # way: the midpoint of the round trip would say -0.4 s; NTP's four times say +2 s, within 0.1 s.
    sent, received = 100.0, 103.2
    node_start, node_end = 100.1 + 2.0, 103.1 + 2.0
    offset, delay = cluster_module.clock_offset(sent, node_start, node_end, received)
    assert abs(offset - 2.0) < 1e-9 and abs(delay - 0.2) < 1e-9
    # Clocks in step, with the script as slow as in the CI run whose midpoint read -1.87 s.
    offset, delay = cluster_module.clock_offset(10.0, 10.3, 14.0, 14.1)
    assert abs(offset - 0.1) < 1e-9 and abs(delay - 0.4) < 1e-9


def test_a_probe_that_ran_out_of_time_says_so_before_the_rows_that_lack_its_answers(tmp_path):
    cluster = _cluster_naming(tmp_path)
    node = cluster.workers[0]
    timed_out = remote.CommandResult(node.name, remote.TIMED_OUT, "", "timed out after 90 s")
    [row] = cluster_module.probe_timeout_rows(node, timed_out)
    assert (row.check, row.node, row.ok) == ("probe", node.name, False)
    assert row.detail.startswith(f"the probe script gave no answer within {cluster_module.PROBE_TIMEOUT_S} s")
    answered = remote.CommandResult(node.name, 0, "time=1.0\ntime_end=1.5\n", "")
    assert cluster_module.probe_timeout_rows(node, answered) == []


def _platform_rows(cluster, states):
    """Every platform's rows of cluster.check, as check() gathers them, for these probe answers."""
    return [row for platform in platforms.ALL for row in platform.check_rows(cluster, states)]


def test_check_names_each_missing_service_as_the_inventory_does(tmp_path):
    cluster = _cluster_naming(
        tmp_path,
        spark_master_service="site-spark",
        postgresql_service="site-postgres",
        determined_master_service="site-det-master",
        determined_agent_service="site-det-agent",
        ray_head_service="site-ray-head",
    )
    # The nodes answered, with none of the services installed.
    rows = _platform_rows(cluster, {node.name: {} for node in cluster.nodes})
    details = {(row.check, row.node): (row.ok, row.detail) for row in rows}
    assert details[("spark master", "n0")] == (False, "no site-spark unit; run ansible-playbook site.yml")
    assert details[("postgresql", "n0")] == (False, "no site-postgres unit; run ansible-playbook site.yml")
    assert details[("determined master", "n0")] == (False, "site-det-master not installed")
    assert details[("determined agent", "n1")] == (False, "site-det-agent not installed")
    assert details[("ray head", "n0")] == (False, "no site-ray-head unit; run ansible-playbook site.yml")
    # Installed and active: the check passes on the inventory's name, not on a pattern.
    states = {"n0": {"service.site-det-master": "active"}, "n1": {"service.site-det-agent": "failed"}}
    rows = _platform_rows(cluster, states)
    details = {(row.check, row.node): (row.ok, row.detail) for row in rows}
    assert details[("determined master", "n0")] == (True, "site-det-master active")
    assert details[("determined agent", "n1")] == (False, "site-det-agent failed")


def test_a_connect_server_is_checked_where_the_inventory_runs_one_and_flagged_where_it_does_not(tmp_path):
    spark = platforms.get("spark")
    application = _cluster_naming(tmp_path / "application", spark_connect_service="site-connect")
    # Left running from spark_session: connect, it holds the workers' cores: standalone cells find none.
    rows = spark.check_rows(application, {"n0": {"service.site-connect": "active"}})
    details = {row.check: (row.ok, row.detail) for row in rows}
    assert details["spark connect"] == (
        False, "site-connect active although spark_session is application: it holds the workers' cores; "
               "`invoke cluster.reset` stops it, ansible-playbook site.yml removes it")
    stopped = spark.check_rows(application, {"n0": {"service.site-connect": "inactive"}})
    assert "spark connect" not in {row.check for row in stopped}
    connect = load_cluster(write_inventory(tmp_path / "connect", CPU_CLUSTER_3, group_vars={
        "all": "dtlab_device: cpu\nspark_session: connect\nspark_connect_service: site-connect\n"}))
    details = {row.check: (row.ok, row.detail) for row in spark.check_rows(connect, {"n0": {}})}
    assert details["spark connect"] == (False, "no site-connect unit; run ansible-playbook site.yml")


def test_reset_restarts_only_an_installed_service():
    missing = subprocess.run(["sh", "-c", restart_command(MISSING_UNIT)], capture_output=True,
                             text=True, timeout=60)
    assert missing.returncode == 0 and not missing.stderr, "a service not installed is left alone"
    command = restart_command("site unit")
    assert "systemctl restart 'site unit.service'" in command


def _spark_reset_commands(cluster) -> list[tuple[str, tuple[str, ...], str]]:
    ran: list[tuple[str, tuple[str, ...], str]] = []
    def run(nodes, command, what, timeout_s):
        ran.append((what, tuple(node.name for node in nodes), command))

    everyone_answers = ResetSteps(cluster, lambda line: None, run, list)
    platforms.get("spark").reset(everyone_answers)
    return ran


def test_reset_stops_a_connect_server_left_running_under_application_and_restarts_it_under_connect(tmp_path):
    application = _cluster_naming(tmp_path / "application", spark_connect_service="site-connect")
    steps = _spark_reset_commands(application)
    # Stopped before the master restarts: its executors would otherwise take the workers' cores again.
    assert [(what, nodes) for what, nodes, _ in steps] == [("stop spark connect", ("n0",)),
                                                          ("restart spark master", ("n0",)),
                                                          ("restart spark workers", ("n1", "n2"))]
    assert steps[0][2].endswith("systemctl stop site-connect.service")
    connect = load_cluster(write_inventory(tmp_path / "connect", CPU_CLUSTER_3, group_vars={
        "all": "dtlab_device: cpu\nspark_session: connect\nspark_connect_service: site-connect\n"}))
    steps = _spark_reset_commands(connect)
    assert [what for what, _, _ in steps] == ["restart spark master", "restart spark workers",
                                             "restart spark connect"]
    assert steps[-1][2].endswith("systemctl restart site-connect.service")
