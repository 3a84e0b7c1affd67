"""`ansible-playbook site.yml` on the test lab, as Molecule would: converge, idempotence, check mode,
then verify for real what each component promises (PostgreSQL, Spark, SSH, Determined configs,
identical trainer environments). Needs root; brings up the session's test lab."""

import json
import re
import shlex
import subprocess
import time

import pytest
import yaml

import dtlab.lab
from dtlab import paths, platforms, provision
from dtlab.lab.access import run_on_node, ssh_argv
from dtlab.pins import pinned
from dtlab.platforms import load_cluster
from dtlab.waiting import wait_until

# The first test also pays for the session's first converge (cold: several minutes on 2 cores).
pytestmark = [pytest.mark.lab, pytest.mark.slow, pytest.mark.timeout(3600)]


@pytest.fixture(scope="module")
def cluster(provisioned_lab):
    lab, _ = provisioned_lab
    return load_cluster(lab.inventory_path)


@pytest.fixture(scope="module")
def before_second_converge(provisioned_lab):
    """Each node's own clock just before the second converge: its systemd journal is read from there."""
    lab, _ = provisioned_lab
    return {node: on(lab, node, "date +%s").stdout.strip() for node in lab.node_names}


@pytest.fixture(scope="module")
def second_converge(provisioned_lab, before_second_converge):
    lab, _ = provisioned_lab
    return provision.converge(lab.inventory_path)


def on(lab, node, command, timeout=120):
    result = run_on_node(lab, node, command, timeout=timeout)
    return result


def as_service_user(cluster, command):
    return f"runuser -u {cluster.user} -- bash -lc {shlex.quote(command)}"


def secret(cluster, name):
    from pathlib import Path

    return (Path(cluster.var("dtlab_secrets_dir")) / name).read_text().split()[0]


# --- converge, idempotence, check mode ---------------------------------------------------------------

@pytest.mark.core
def test_every_role_applies_on_every_node(provisioned_lab):
    lab, first = provisioned_lab
    assert first.ok, first.summary()
    assert sorted(set(first.hosts) - {"localhost"}) == sorted(lab.node_names)  # localhost: validation play
    for role in ("common", "ssh", "nvidia", "docker", "trainer", "postgresql", "spark", "ray",
                 "slurm", "determined_master", "determined_agent", "horovod",
                 "systemd_units", "determined_common"):  # the last two: imported by the others
        assert f"TASK [{role} : " in first.output, f"role {role} did not run"


def test_gpu_roles_skip_with_their_message_on_the_gpu_less_lab(provisioned_lab):
    lab, first = provisioned_lab
    for node in lab.node_names:
        assert f"nvidia: no NVIDIA GPU on {node} (lspci)" in first.output
        assert f"docker: no NVIDIA GPU on {node} (lspci)" in first.output


def test_second_run_changes_nothing(second_converge):
    assert second_converge.ok, second_converge.summary()
    assert second_converge.changed_hosts == {}, second_converge.summary()


def test_second_run_reloads_no_systemd_units(provisioned_lab, second_converge, before_second_converge):
    lab, first = provisioned_lab
    # The units were new then (roles/systemd_units writes spark's, ray's and reloads for them).
    assert "RUNNING HANDLER [systemd_units : Reload systemd units]" in first.output
    assert "Reload systemd units" not in second_converge.output
    for node, since in before_second_converge.items():
        # PID 1 logs "Reloading." on every daemon-reload (which detaches GPUs from containers).
        journal = on(lab, node, f"journalctl _PID=1 --since=@{since} --no-pager -o cat")
        assert journal.returncode == 0, journal.stderr
        reloads = [line for line in journal.stdout.splitlines()
                   if line.strip() in ("Reloading.", "Reloading...")
                   or line.startswith("Reloading requested")]
        assert reloads == [], f"{node}: {journal.stdout[-1500:]}"


def test_check_diff_after_convergence_reports_no_changes(provisioned_lab, second_converge):
    lab, _ = provisioned_lab
    checked = provision.converge(lab.inventory_path, check=True, diff=True)
    assert checked.ok, checked.summary()
    assert checked.changed_hosts == {}, checked.summary()
    names = ("determined_db_password", "spark_auth_secret", "determined_admin_password", "ray_auth_token",
             "munge_key")
    for name in names:
        assert secret(load_cluster(lab.inventory_path), name) not in checked.output


def test_docker_keeps_a_daemon_json_that_nvidia_ctk_rewrote(provisioned_lab, second_converge):
    """As on a GPU node: nvidia-ctk added its runtime and rewrote daemon.json in its own layout (Go's
    MarshalIndent: sorted keys, 4 spaces, no final newline). The next converge must not touch it."""
    lab, _ = provisioned_lab
    path = "/etc/docker/daemon.json"
    original = on(lab, "node1", f"cat {path}").stdout
    rewritten = json.dumps({**json.loads(original),
                            "runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}},
                           indent=4, sort_keys=True)
    assert on(lab, "node1", f"printf %s {shlex.quote(rewritten)} > {path}").returncode == 0
    try:
        again = provision.converge(lab.inventory_path, tags=["docker"], limit="node1")
        assert again.ok, again.summary() + again.output[-3000:]
        assert again.count("changed", "node1") == 0, again.summary()
        assert on(lab, "node1", f"cat {path}").stdout == rewritten
    finally:
        on(lab, "node1", f"printf %s {shlex.quote(original)} > {path}")


# --- the offline bundle (the session lab is an offline lab: tests/conftest.py, docs/offline.md) -----------

@pytest.mark.core
def test_every_node_installed_from_the_bundle_alone(provisioned_lab, cluster):
    """No apt proxy ran during the converge (the lab has none); apt on every node reads the bundle alone;
    the trainer units read Hugging Face's offline switches; pip and Horovod took the bundle's wheels."""
    lab, first = provisioned_lab
    bundle_dir = cluster.var("dtlab_bundle_dir")
    assert cluster.var("dtlab_bundle") and not dtlab.lab.status(lab.name)["apt_proxy_pid"]
    assert "TASK [common : Make apt read the bundle's list alone]" in first.output
    assert "TASK [horovod : Find the wheel for the venv's torch and Python in the bundle]" in first.output
    assert "TASK [trainer : Work out what the wheelhouse must hold]" not in first.output  # its fill: skipped
    assert "Build the Horovod wheel into the wheelhouse" not in first.output
    for node in cluster.nodes:
        sources = on(lab, node.name, "apt-get indextargets --format '$(SITE)' | sort -u").stdout.split()
        assert sources == [f"file:{bundle_dir}/apt"], (node.name, sources)
        env_file = on(lab, node.name, f"cat {cluster.socket_env_file}").stdout.splitlines()
        offline = {"HF_HUB_OFFLINE=1", "HF_DATASETS_OFFLINE=1", f"HF_HUB_CACHE={bundle_dir}/hf/hub"}
        assert offline <= set(env_file), env_file
        horovod = on(lab, node.name, f"cat {cluster.venv_dir}/.dtlab-horovod").stdout
        assert horovod.startswith("horovod-") and "+torch" in horovod, horovod


# --- the socket interface ----------------------------------------------------------------------------

def test_each_node_uses_the_kvm_style_nic_that_holds_its_address(provisioned_lab, cluster):
    lab, first = provisioned_lab
    assert lab.node_ifname == "enp1s0"  # named like a KVM guest's NIC; nothing tells the roles
    for node in cluster.nodes:
        env_file = on(lab, node.name, f"cat {cluster.socket_env_file}").stdout
        assert env_file.startswith("GLOO_SOCKET_IFNAME=enp1s0\nNCCL_SOCKET_IFNAME=enp1s0\n"), node.name
        assert f"{node.name}: gloo and NCCL use enp1s0 (it holds ansible_host {node.address})" in first.output
    for worker in cluster.workers:  # Spark's executors inherit their worker's environment
        spark_env = on(lab, worker.name, f"cat {cluster.var('spark_conf_dir')}/spark-env.sh").stdout
        assert "GLOO_SOCKET_IFNAME=enp1s0" in spark_env.splitlines()


def test_cluster_check_shows_each_interface_and_says_no_gpu_on_the_cpu_lab(provisioned_lab, cluster):
    from dtlab import cluster as cluster_module

    rows = cluster_module.check(cluster)
    assert cluster_module.failed(rows) == []
    sockets = {r.node: r for r in rows if r.check == "socket interface"}
    assert sorted(sockets) == sorted(n.name for n in cluster.nodes)
    for node in cluster.nodes:
        assert sockets[node.name].ok and sockets[node.name].detail.startswith(f"enp1s0 {node.address}/24")
    gpu_rows = [r for r in rows if r.check in ("gpu usable", "determined slots", "spark GPUs")]
    assert len(gpu_rows) == 3 * len(cluster.workers)
    assert all(r.detail == "no GPU (cpu inventory)" and not r.required for r in gpu_rows)
    # The Ray head sees every worker's raylet, each offering CPU slots on the CPU lab.
    [ray_head] = [r for r in rows if r.check == "ray head"]
    workers = len(cluster.workers)
    assert ray_head.ok and f"{workers}/{workers} worker nodes alive" in ray_head.detail
    assert sorted(r.node for r in rows if r.check == "ray worker" and r.ok) == sorted(
        w.name for w in cluster.workers)


# --- PostgreSQL --------------------------------------------------------------------------------------

def psql(password, host, extra=""):
    prefix = f"PGPASSWORD={shlex.quote(password)} " if password is not None else ""
    return (f"{prefix}PGCONNECT_TIMEOUT=5 psql -w -h {host} -U determined -d determined {extra} "
            f"-tAc 'select current_user'")


def test_postgresql_admits_determined_from_the_master_only(provisioned_lab, cluster):
    lab, _ = provisioned_lab
    password = secret(cluster, "determined_db_password")
    master, worker = cluster.master, cluster.workers[0]
    for host in ("127.0.0.1", master.address):
        from_master = on(lab, master.name, psql(password, host))
        assert from_master.returncode == 0 and from_master.stdout.strip() == "determined", from_master.stderr
    from_worker = on(lab, worker.name, psql(password, master.address))
    assert from_worker.returncode != 0
    assert "no pg_hba.conf entry" in from_worker.stderr, from_worker.stderr
    without_password = on(lab, master.name, psql(None, master.address))
    assert without_password.returncode != 0
    assert "password" in without_password.stderr, without_password.stderr
    wrong_password = on(lab, master.name, psql("not-the-password", "127.0.0.1"))
    assert "password authentication failed" in wrong_password.stderr, wrong_password.stderr
    method = on(lab, master.name, "runuser -u postgres -- psql -tAc "
                "\"select rolpassword like 'SCRAM-SHA-256%' from pg_authid where rolname='determined'\"")
    assert method.stdout.strip() == "t"


# --- Spark -------------------------------------------------------------------------------------------

SPARK_APP = (
    "import sys; from pyspark.sql import SparkSession; "
    "spark = SparkSession.builder.appName('dtlab-provision-test').getOrCreate(); "
    "print('COUNT', spark.sparkContext.parallelize(range(100), 4).count()); spark.stop()"
)


def test_spark_master_lists_both_workers_alive(provisioned_lab, cluster):
    lab, _ = provisioned_lab
    master = cluster.master
    url = f"http://{master.address}:{platforms.spark.master_webui_port(cluster)}/json/"
    state = on(lab, master.name, f"python3 -c \"import urllib.request; print(urllib.request.urlopen("
                                 f"'{url}').read().decode())\"")
    workers = json.loads(state.stdout)["workers"]
    alive = sorted(w["host"] for w in workers if w["state"] == "ALIVE")
    assert alive == sorted(w.address for w in cluster.workers)


def test_spark_master_ui_cannot_kill_applications(provisioned_lab, cluster):
    lab, _ = provisioned_lab
    master = cluster.master
    ui = f"http://{master.address}:{platforms.spark.master_webui_port(cluster)}"
    kill = on(lab, master.name, f"curl -s -o /dev/null -w '%{{http_code}}' -X POST "
                                f"'{ui}/app/kill/?id=app-00000000000000-0000&terminate=true'")
    assert kill.stdout.strip() == "405", kill.stdout + kill.stderr  # no kill handler on the master UI
    environment = on(lab, master.name, f"curl -s {ui}/environment/").stdout
    assert "<td>spark.ui.killEnabled</td><td>false</td>" in environment
    assert secret(cluster, "spark_auth_secret") not in environment
    conf = on(lab, master.name, f"cat {cluster.var('spark_conf_dir')}/spark-defaults.conf").stdout
    assert "spark.ui.killEnabled                 false" in conf


def test_spark_runs_an_app_with_the_secret_and_refuses_one_without(provisioned_lab, cluster):
    lab, _ = provisioned_lab
    master = cluster.master
    spark_conf_dir = cluster.var("spark_conf_dir")
    # The lab's Connect server (spark_session: connect) holds every worker's cores: an app of its own would
    # wait for executors, so the server stands aside while this one runs.
    connect_unit = cluster.var("spark_connect_service")
    assert platforms.spark.connect_session(cluster)
    on(lab, master.name, f"systemctl stop {connect_unit}")
    try:
        with_secret = on(lab, master.name, as_service_user(
            cluster, f"SPARK_CONF_DIR={spark_conf_dir} {cluster.python} -c \"{SPARK_APP}\""), timeout=300)
    finally:
        on(lab, master.name, f"systemctl start {connect_unit}")
    assert "COUNT 100" in with_secret.stdout, with_secret.stderr[-3000:]
    # The same app, but with a configuration that lacks the secret: the master must refuse it.
    without_secret = on(lab, master.name, as_service_user(
        cluster, "mkdir -p /tmp/nosecret && grep -v '^spark.authenticate' "
                 f"{spark_conf_dir}/spark-defaults.conf > /tmp/nosecret/spark-defaults.conf; "
                 f"SPARK_CONF_DIR=/tmp/nosecret timeout 45 {cluster.python} -c \"{SPARK_APP}\""), timeout=120)
    assert "COUNT 100" not in without_secret.stdout
    unit = cluster.var("spark_master_service")
    log = on(lab, master.name, f"journalctl -u {unit} --since '-3min' --no-pager")
    assert "Expected SaslMessage, received something else" in log.stdout, log.stdout[-3000:]
    needed = platforms.spark.cores_needed(cluster, cluster.max_gpus)  # as it was: the server holds its cores
    assert platforms.spark.wait_for_connect_cores(cluster, needed, 120) >= needed


# --- Ray ---------------------------------------------------------------------------------------------

def ray_http(lab, cluster, path, token="file", method="GET", body=None):
    """(status, body) of a request from the master to the head's dashboard. token: "file" sends the
    cluster's token (read on the node), None sends none, any other string is sent as the token."""
    url = f"http://{cluster.master.address}:{cluster.var('ray_dashboard_port')}{path}"
    command = f"curl -s -m 30 -w '\\n%{{http_code}}' -X {method} {shlex.quote(url)}"
    if token == "file":
        token_file = cluster.var("ray_auth_token_file")
        command += f' -H "Authorization: Bearer $(cat {token_file})"'
    elif token is not None:
        command += " -H " + shlex.quote(f"Authorization: Bearer {token}")
    if body is not None:
        command += " -H 'Content-Type: application/json' -d " + shlex.quote(json.dumps(body))
    result = on(lab, cluster.master.name, command)
    text, _, status = result.stdout.rpartition("\n")
    return int(status or 0), text


def test_ray_head_lists_both_workers_alive_offering_what_spark_offers(provisioned_lab, cluster):
    lab, _ = provisioned_lab
    status, text = ray_http(lab, cluster, "/api/v0/nodes")
    assert status == 200, text
    nodes = [n for n in json.loads(text)["data"]["result"]["result"] if n["state"] == "ALIVE"]
    head = [n for n in nodes if n["is_head_node"]]
    assert [n["node_ip"] for n in head] == [cluster.master.address]
    assert "CPU" not in head[0]["resources_total"] and "GPU" not in head[0]["resources_total"]  # no training
    workers = {n["node_ip"]: n["resources_total"] for n in nodes if not n["is_head_node"]}
    assert sorted(workers) == sorted(w.address for w in cluster.workers)
    # The same slots as Spark: each Ray worker's CPUs are its Spark worker's cores; no GPU in the lab.
    spark_url = f"http://{cluster.master.address}:{platforms.spark.master_webui_port(cluster)}/json/"
    spark = json.loads(on(lab, cluster.master.name, f"curl -s -m 30 {spark_url}").stdout)
    spark_cores = {w["host"]: w["cores"] for w in spark["workers"] if w["state"] == "ALIVE"}
    assert {address: resources.get("CPU") for address, resources in workers.items()} == spark_cores
    # On the cpu lab exactly one cell process's threads (dtlab_worker_cores): no second rank fits on a worker.
    assert set(spark_cores.values()) == {cluster.threads_per_worker}, spark_cores
    assert all("GPU" not in resources for resources in workers.values())
    # The role's object store: half of each node's /dev/shm, which nspawn makes smaller than Ray's default
    # (30% of the host's memory), so the store stays in shared memory and not on disk.
    for node in cluster.nodes:
        shm = int(on(lab, node.name, "df --output=size --block-size=1 /dev/shm").stdout.split()[-1])
        [store] = [n["resources_total"]["object_store_memory"] for n in nodes if n["node_ip"] == node.address]
        assert abs(store - shm / 2) <= 0.01 * shm, (node.name, store, shm)


def test_ray_gcs_admits_the_service_user_with_the_token_only(provisioned_lab, cluster):
    lab, _ = provisioned_lab
    status_cmd = (f"{cluster.venv_dir}/bin/ray status "
                  f"--address {cluster.master.address}:{cluster.var('ray_gcs_port')}")
    token_path = f"RAY_AUTH_TOKEN_PATH={cluster.var('ray_auth_token_file')}"
    with_token = on(lab, cluster.master.name,
                    as_service_user(cluster, f"RAY_AUTH_MODE=token {token_path} {status_cmd}"))
    assert with_token.returncode == 0, with_token.stderr[-2000:]
    assert with_token.stdout.count(" node_") == 1 + len(cluster.workers), with_token.stdout  # Active: ...
    # A client without the token (not in token mode, no token file in its home) and one with a wrong token.
    for env in ("", "RAY_AUTH_MODE=token RAY_AUTH_TOKEN=not-the-token"):
        refused = on(lab, cluster.master.name, as_service_user(cluster, f"{env} {status_cmd}"))
        output = refused.stdout + refused.stderr
        assert refused.returncode != 0, env
        assert "ray.exceptions.AuthenticationError: RPC error: InvalidAuthToken" in output, output[-2000:]


def test_ray_dashboard_and_jobs_api_refuse_requests_without_the_token(provisioned_lab, cluster):
    lab, _ = provisioned_lab
    # The job's driver runs on the head; its tasks run on the workers, in the units' environment.
    job = {"entrypoint": f"{cluster.python} -c \"import json, os, ray; ray.init(); "
                         "task = ray.remote(num_cpus=1, scheduling_strategy='SPREAD')(lambda: ("
                         "ray.util.get_node_ip_address(), os.environ.get('GLOO_SOCKET_IFNAME'), "
                         "os.environ.get('PYTHONPATH'))); "
                         "print('RAY_CPUS', ray.cluster_resources().get('CPU')); "
                         "results = ray.get([task.remote() for _ in range(4)]); "
                         "print('RAY_TASKS', json.dumps(sorted(set(results))))\""}
    for method, path, body in (("GET", "/api/v0/nodes", None), ("GET", "/api/jobs/", None),
                               ("POST", "/api/jobs/", job)):
        assert ray_http(lab, cluster, path, None, method, body)[0] == 401, (method, path)
        assert ray_http(lab, cluster, path, "not-the-token", method, body)[0] == 403, (method, path)
    status, text = ray_http(lab, cluster, "/api/jobs/")
    assert status == 200 and isinstance(json.loads(text), list), text
    status, text = ray_http(lab, cluster, "/api/jobs/", method="POST", body=job)
    assert status == 200, text
    submission = json.loads(text)["submission_id"]
    for _ in range(60):
        state = json.loads(ray_http(lab, cluster, f"/api/jobs/{submission}")[1])
        if state["status"] in ("SUCCEEDED", "FAILED", "STOPPED"):
            break
        time.sleep(3)
    logs = json.loads(ray_http(lab, cluster, f"/api/jobs/{submission}/logs")[1])["logs"]
    assert state["status"] == "SUCCEEDED", f"{state}\n{logs[-2000:]}"
    # Each worker offers one cell process's threads (dtlab_worker_cores on the cpu lab), the head none.
    offered = len(cluster.workers) * cluster.threads_per_worker
    assert f"RAY_CPUS {float(offered)}" in logs.splitlines(), logs[-2000:]
    tasks = json.loads(next(line for line in logs.splitlines() if line.startswith("RAY_TASKS "))[10:])
    assert tasks == sorted([w.address, "enp1s0", cluster.code_dir] for w in cluster.workers)


def test_ray_dashboard_listens_on_the_cluster_address_only(provisioned_lab, cluster):
    lab, _ = provisioned_lab
    port = cluster.var("ray_dashboard_port")
    listeners = on(lab, cluster.master.name, f"ss -ltnH 'sport = :{port}'").stdout.split("\n")
    local_addresses = sorted({line.split()[3] for line in listeners if line.strip()})
    assert local_addresses == [f"{cluster.master.address}:{port}"], listeners


def test_ray_token_file_belongs_to_the_service_user_alone(provisioned_lab, cluster):
    lab, first = provisioned_lab
    path = cluster.var("ray_auth_token_file")
    token = secret(cluster, "ray_auth_token")
    for node in cluster.nodes:
        mode_and_owners = on(lab, node.name, f"stat -c '%a %U %G' {path}").stdout.split()
        assert mode_and_owners == ["600", cluster.user, cluster.user], node.name
        assert on(lab, node.name, f"cat {path}").stdout == token, node.name
        assert token not in on(lab, node.name, "systemctl show --property=Environment 'dtlab-ray-*'").stdout
    assert token not in first.output


def test_a_ray_unit_deletes_all_but_the_newest_sessions_before_it_starts(provisioned_lab, cluster):
    """Ray deletes none of its session directories; each start of a unit deletes all but the newest few."""
    lab, _ = provisioned_lab
    worker = cluster.workers[-1]
    temp_dir = cluster.var("ray_temp_dir")
    keep = yaml.safe_load((paths.REPO_ROOT / "roles/ray/defaults/main.yml").read_text())["ray_keep_sessions"]
    sessions = f"ls -1d {temp_dir}/session_2* | sort"
    current = on(lab, worker.name, sessions).stdout.split()
    assert current, "the running worker has a session directory"
    # Older than any real session (by name, as Ray's are by time): one more than is kept.
    old = [f"{temp_dir}/session_2000-01-{day:02d}_00-00-00_000000_1" for day in range(1, keep + 2)]
    made = on(lab, worker.name, as_service_user(cluster, f"mkdir {' '.join(old)}"))
    assert made.returncode == 0, made.stderr
    before = current + old
    joined_before = {node["node_id"] for node in platforms.ray.alive_workers(cluster)}
    restarted = on(lab, worker.name, f"systemctl restart {cluster.var('ray_worker_service')}")
    assert restarted.returncode == 0, restarted.stderr
    try:
        after = on(lab, worker.name, sessions).stdout.split()
        assert after == sorted(before)[-keep:], after  # the newest kept: every real one, then the newest old
        assert current[-1] in after
    finally:  # the restarted raylet joins again as a new Ray node, beside the other workers
        def rejoined() -> bool:
            alive = {node["node_id"] for node in platforms.ray.alive_workers(cluster)}
            return len(alive) == len(cluster.workers) and bool(alive - joined_before)
        assert wait_until(rejoined, timeout_s=120, every_s=2), "the restarted worker did not rejoin Ray"


# --- Slurm -------------------------------------------------------------------------------------------

def test_slurm_shows_every_worker_idle_and_runs_a_step_on_both(provisioned_lab, cluster):
    lab, _ = provisioned_lab
    partition = cluster.var("slurm_partition")
    sinfo = on(lab, cluster.master.name, "sinfo --noheader --Node --format '%N %R %t'")
    expected = sorted(f"{w.name} {partition} idle" for w in cluster.workers)
    assert sorted(sinfo.stdout.split("\n")[:-1]) == expected, sinfo.stdout + sinfo.stderr
    step = on(lab, cluster.master.name, as_service_user(cluster, "timeout 60 srun -N2 hostname"), timeout=90)
    assert step.returncode == 0, step.stderr[-2000:]
    assert sorted(step.stdout.split()) == sorted(w.name for w in cluster.workers)


def test_munge_key_is_the_cluster_secret_readable_by_munge_alone(provisioned_lab, cluster):
    lab, first = provisioned_lab
    path = cluster.var("slurm_munge_key_file")
    key = secret(cluster, "munge_key")
    for node in cluster.nodes:
        assert on(lab, node.name, f"stat -c '%a %U' {path}").stdout.split() == ["400", "munge"], node.name
        assert on(lab, node.name, f"cat {path}").stdout == key, node.name
    assert key not in first.output


def test_slurm_refuses_a_job_signed_with_a_wrong_munge_key(provisioned_lab, cluster):
    """A second munged with another key, on its own socket, signs the job: slurmctld cannot decode its
    credential and drops the request. The node's own munged and key stay untouched (the other tests
    share this lab)."""
    lab, _ = provisioned_lab
    scratch = "/run/dtlab-wrong-munge"
    conf = f"{cluster.var('slurm_conf_dir')}/slurm.conf"
    start = (f"mkdir -p -m 0755 {scratch} && chown munge: {scratch} && "
             f"head -c 64 /dev/urandom > {scratch}/key && chmod 0400 {scratch}/key && "
             f"chown munge: {scratch}/key && "
             f"runuser -u munge -- munged --socket={scratch}/socket --key-file={scratch}/key "
             f"--pid-file={scratch}/pid --log-file={scratch}/log --seed-file={scratch}/seed && "
             f"sed '/^AuthInfo=/d' {conf} > {scratch}/slurm.conf && echo AuthInfo=socket={scratch}/socket "
             f">> {scratch}/slurm.conf")
    master = cluster.master.name
    # The controller's own word for where it logs, not a copy of the role's path.
    shown = on(lab, master, "scontrol show config").stdout
    found = re.search(r"^SlurmctldLogFile\s*=\s*(\S+)", shown, re.MULTILINE)
    assert found, shown[-2000:]
    controller_log = found.group(1)
    try:
        started = on(lab, master, start)
        assert started.returncode == 0, started.stderr
        log_lines = int(on(lab, master, f"wc -l < {controller_log}").stdout)
        wrong = on(lab, master, as_service_user(
            cluster, f"SLURM_CONF={scratch}/slurm.conf timeout 60 sbatch --wrap true"), timeout=90)
        assert wrong.returncode != 0 and "Submitted batch job" not in wrong.stdout, wrong.stdout
        assert "Batch job submission failed" in wrong.stderr, wrong.stderr[-2000:]
        said = on(lab, master, f"tail -n +{log_lines + 1} {controller_log}").stdout
        assert "Invalid credential" in said, said[-2000:]  # munge's word for another key's credential
        right = on(lab, master, as_service_user(cluster, "timeout 60 sbatch --wrap true"), timeout=90)
        assert right.returncode == 0 and "Submitted batch job" in right.stdout, right.stderr[-2000:]
    finally:
        on(lab, master, f"kill $(cat {scratch}/pid) 2>/dev/null; rm -rf {scratch}")


def test_slurm_daemons_listen_on_their_cluster_address_only(provisioned_lab, cluster):
    """CommunicationParameters=NoCtldInAddrAny,NoInAddrAny: not on 0.0.0.0, where the firewall alone would
    keep outsiders away."""
    lab, _ = provisioned_lab
    for node, port in [(cluster.master, cluster.var("slurm_slurmctld_port"))] + [
        (worker, cluster.var("slurm_slurmd_port")) for worker in cluster.workers
    ]:
        listeners = on(lab, node.name, f"ss -ltnH 'sport = :{port}'").stdout.splitlines()
        local_addresses = sorted({line.split()[3] for line in listeners if line.strip()})
        assert local_addresses == [f"{node.address}:{port}"], (node.name, listeners)


def test_slurmd_starts_after_the_units_it_is_given_and_gpu_less_nodes_get_none(provisioned_lab, cluster):
    """The lab has no GPU, so no worker waits for nvidia-persistenced; given another real unit (ssh), the
    first worker's slurmd is ordered after it and pulls it in, and still starts and registers."""
    lab, _ = provisioned_lab
    first, other = cluster.workers[0].name, cluster.workers[-1].name
    dropin = "/etc/systemd/system/slurmd.service.d/dtlab-after.conf"
    for worker in cluster.workers:
        assert on(lab, worker.name, f"test -e {dropin}").returncode == 1, worker.name
    wanted = "ssh.service"
    only_first = f"{{{{ ['{wanted}'] if inventory_hostname == '{first}' else [] }}}}"
    given = provision.converge(lab.inventory_path, tags=["slurm"], limit="workers",
                               extravars={"slurm_slurmd_after_units": only_first})
    try:
        assert given.ok, given.summary() + given.output[-3000:]
        shown = on(lab, first, "systemctl show slurmd -p After -p Wants").stdout
        properties = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
        assert wanted in properties["After"].split() and wanted in properties["Wants"].split(), shown
        assert on(lab, other, f"test -e {dropin}").returncode == 1  # a node without GPUs: no drop-in
        assert wanted not in on(lab, other, "systemctl show slurmd -p Wants").stdout
        restarted = on(lab, first, "systemctl restart slurmd && systemctl is-active slurmd")
        assert restarted.stdout.strip() == "active", restarted.stdout + restarted.stderr
    finally:
        restored = provision.converge(lab.inventory_path, tags=["slurm"], limit=first)
        assert restored.ok, restored.summary() + restored.output[-3000:]
    assert on(lab, first, f"test -e {dropin}").returncode == 1
    assert wanted not in on(lab, first, "systemctl show slurmd -p Wants").stdout

    def first_worker_idle() -> bool:
        state = on(lab, cluster.master.name, f"sinfo --noheader --Node --nodes {first} --format %t").stdout
        return state.strip() == "idle"

    assert wait_until(first_worker_idle, timeout_s=90, every_s=3), f"{first} did not register idle again"


# --- SSH -------------------------------------------------------------------------------------------

def test_every_node_reaches_every_other_by_name_without_a_prompt(provisioned_lab, cluster):
    lab, _ = provisioned_lab
    names = [n.name for n in cluster.nodes]
    for source in names:
        hops = " && ".join(f"ssh -o BatchMode=yes -o ConnectTimeout=5 {target} hostname"
                           for target in names if target != source)
        result = on(lab, source, as_service_user(cluster, hops))
        assert result.returncode == 0, f"{source}: {result.stderr}"
        assert result.stdout.split() == [t for t in names if t != source]
        hosts = on(lab, source, "getent hosts " + " ".join(names)).stdout
        for node in cluster.nodes:
            assert f"{node.address}" in hosts and node.name in hosts


def test_sshd_refuses_passwords_and_still_admits_the_keys(provisioned_lab, cluster):
    lab, _ = provisioned_lab
    for node in cluster.nodes:
        effective = on(lab, node.name, "/usr/sbin/sshd -T")  # this very login: root with the lab's key
        assert effective.returncode == 0, f"{node.name}: {effective.stderr}"
        lines = effective.stdout.splitlines()
        assert "passwordauthentication no" in lines and "kbdinteractiveauthentication no" in lines, node.name
        assert "permitrootlogin without-password" in lines, node.name  # prohibit-password
        # From the controller, a password-only login: refused because the node offers keys only.
        argv = ssh_argv(lab, node.name, "true")
        argv[1:1] = ["-o", "PreferredAuthentications=password,keyboard-interactive",
                     "-o", "PubkeyAuthentication=no"]
        password = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        assert password.returncode == 255, f"{node.name}: {password.stdout} {password.stderr}"
        assert "Permission denied (publickey)." in password.stderr, f"{node.name}: {password.stderr}"


# --- Determined ------------------------------------------------------------------------------------

def test_determined_configs_parse_and_carry_the_inventory_values(provisioned_lab, cluster):
    lab, _ = provisioned_lab
    master = yaml.safe_load(on(lab, cluster.master.name, "cat /etc/determined/master.yaml").stdout)
    assert master["port"] == platforms.determined.master.master_port(cluster)
    assert master["db"] == {"host": "127.0.0.1", "port": platforms.determined.postgresql_port(cluster),
                            "name": "determined", "user": "determined",
                            "password": secret(cluster, "determined_db_password")}
    assert master["checkpoint_storage"]["type"] == "shared_fs"
    assert master["checkpoint_storage"]["host_path"] == cluster.var("determined_checkpoint_host_path")
    assert master["resource_manager"]["scheduler"]["type"] == "priority"
    assert master["security"]["initial_user_password"] == secret(cluster, "determined_admin_password")
    # master.yaml holds the passwords (roles/determined_common writes it 0600); agent.yaml holds none.
    assert on(lab, cluster.master.name, "stat -c '%a %U' /etc/determined/master.yaml").stdout.split() == [
        "600", "root"]
    agent_ids = []
    for worker in cluster.workers:
        assert on(lab, worker.name, "stat -c '%a' /etc/determined/agent.yaml").stdout.strip() == "644"
        agent = yaml.safe_load(on(lab, worker.name, "cat /etc/determined/agent.yaml").stdout)
        assert agent["master_host"] == cluster.master.address
        assert agent["master_port"] == platforms.determined.master.master_port(cluster)
        assert agent["slot_type"] == ("cuda" if worker.device == "cuda" else "cpu")
        agent_ids.append(agent["agent_id"])
    assert sorted(agent_ids) == sorted(w.name for w in cluster.workers)


# --- trainer -----------------------------------------------------------------------------------------

def test_trainer_environment_is_identical_on_every_node(provisioned_lab, cluster):
    lab, _ = provisioned_lab
    freezes = {n.name: on(lab, n.name, f"{cluster.python} -m pip freeze --all").stdout for n in cluster.nodes}
    assert len(set(freezes.values())) == 1, {k: len(v) for k, v in freezes.items()}
    packages = next(iter(freezes.values()))
    assert all(f"{name}=={pinned(name)}" in packages for name in ("torch", "pyspark", "determined"))
    # The lab installs Horovod (horovod_install: true in group_vars/lab.yml): dtlab's build for this torch.
    # pip freeze names it by the wheel it came from: horovod @ file:///.../horovod-0.28.1%2Btorch2.13.0.cpu-...whl
    wheel = f"horovod-{cluster.var('horovod_version')}%2Btorch{pinned('torch')}"
    assert re.search(rf"^horovod @ file://\S+/{re.escape(wheel)}\S*\.whl$", packages, re.M), packages
    # Installed with pip's --no-compile, then the launchers' imports compiled: torch's own bytecode is
    # there, that of a test helper no run imports (torch.testing._internal.common_utils) is not.
    probe = (f"{cluster.python} -c \"import os, torch, importlib.util as u; "
             "d = os.path.dirname(torch.__file__); print(*(os.path.exists(u.cache_from_source(d + f)) "
             "for f in ('/__init__.py', '/testing/_internal/common_utils.py')))\"")
    for node in cluster.nodes:
        assert on(lab, node.name, f"PYTHONDONTWRITEBYTECODE=1 {probe}").stdout.split() == ["True", "False"]


def task_outcomes(output: str, task: str) -> dict[str, str]:
    """host -> outcome (ok, changed, skipping, ...) of one task in a converge's output."""
    block = output.split(f"TASK [{task}]", 1)[1].split("TASK [", 1)[0]
    return dict((host, outcome) for outcome, host in re.findall(r"^(\w+): \[([\w.-]+)\]", block, re.M))


def test_the_lab_installs_the_venv_on_its_first_node_and_copies_it_to_the_others(provisioned_lab, cluster):
    """trainer_venv_share_dir (group_vars/lab.yml): one pip install on the 2 cores the nodes share, not
    three; the copy's bytecode and pins are checked on every node above. The copy leaves nothing behind."""
    lab, first = provisioned_lab
    first_node, *others = lab.node_names
    installed = task_outcomes(first.output, "trainer : Install the pinned packages into the venv")
    unpacked = task_outcomes(first.output, "trainer : Unpack the copy")
    assert installed == {first_node: "changed", **dict.fromkeys(others, "skipping")}, installed
    assert unpacked == {first_node: "skipping", **dict.fromkeys(others, "changed")}, unpacked
    shared = cluster.var("dtlab_shared_checkpoint_dir")  # the lab's trainer_venv_share_dir
    assert on(lab, first_node, f"ls -A {shared} | grep -c dtlab-venv || true").stdout.strip() == "0"


# --- restarts on change (roles/systemd_units) ---------------------------------------------------------

def test_a_changed_file_restarts_its_own_service_alone(provisioned_lab, cluster, second_converge):
    """Spark, Ray and Slurm restart through roles/systemd_units when, and only when, their own files change:
    a changed spark-env.sh restarts the Spark worker (no reload), a changed Ray unit file reloads systemd and
    restarts the Ray worker, a changed cgroup.conf restarts slurmd and leaves munge (only its key restarts
    it) alone. Last in this module: the restarted workers rejoin before it ends."""
    lab, _ = provisioned_lab
    node = cluster.workers[0].name
    spark, ray, slurmd, munge = (cluster.var(name) for name in (
        "spark_worker_service", "ray_worker_service", "slurm_slurmd_service", "slurm_munge_service"))

    def started_at() -> dict[str, str]:
        show = "systemctl show -p ActiveEnterTimestampMonotonic --value"
        return {unit: on(lab, node, f"{show} {unit}").stdout.strip() for unit in (spark, ray, slurmd, munge)}

    mark = "# changed by test_a_changed_file_restarts_its_own_service_alone"
    changed = [f"{cluster.var('spark_conf_dir')}/spark-env.sh", f"/etc/systemd/system/{ray}.service",
               f"{cluster.var('slurm_conf_dir')}/cgroup.conf"]
    before = started_at()
    ray_joined_before = {worker["node_id"] for worker in platforms.ray.alive_workers(cluster)}
    assert on(lab, node, " && ".join(f"echo '{mark}' >> {path}" for path in changed)).returncode == 0
    try:
        again = provision.converge(lab.inventory_path, tags=["spark", "ray", "slurm"], limit=node)
        assert again.ok, again.summary() + again.output[-3000:]
        plays = {name: again.output[again.output.index(f"PLAY [{name}]"):] for name in (
            "Spark standalone master and workers", "Ray head and worker nodes",
            "Slurm controller and compute nodes, authenticated by munge")}
        spark_play, ray_play, slurm_play = (text.split("\nPLAY [")[0] for text in plays.values())
        assert "RUNNING HANDLER [systemd_units : Restart spark]" in spark_play, spark_play[-3000:]
        assert "Reload systemd units" not in spark_play  # a config file, not a unit: no daemon-reload
        assert "RUNNING HANDLER [systemd_units : Reload systemd units]" in ray_play, ray_play[-3000:]
        assert ray_play.index("Reload systemd units") < ray_play.index("[systemd_units : Restart ray]")
        assert "RUNNING HANDLER [systemd_units : Restart slurm]" in slurm_play, slurm_play[-3000:]
        assert "Restart munge" not in slurm_play
        after = started_at()
        restarted = {unit for unit in before if after[unit] != before[unit]}
        assert restarted == {spark, ray, slurmd}, (before, after)
        for path in changed:
            assert mark not in on(lab, node, f"cat {path}").stdout, path  # the roles wrote them back
    finally:  # the restarted workers join Spark, Ray and the Slurm partition again
        def rejoined() -> bool:
            ray_alive = {worker["node_id"] for worker in platforms.ray.alive_workers(cluster)}
            slurm_state = on(lab, cluster.master.name, f"sinfo --noheader --Node --nodes {node} --format %t")
            return (platforms.spark.alive_workers(cluster) == len(cluster.workers)
                    and len(ray_alive) == len(cluster.workers) and bool(ray_alive - ray_joined_before)
                    and slurm_state.stdout.strip() == "idle")
        assert wait_until(rejoined, timeout_s=180, every_s=3), f"{node} did not rejoin Spark, Ray and Slurm"
