"""The harness logs in to Determined with the password the master was given: the generated secret that
Ansible renders into master.yaml (initial_user_password) is the file dtlab.platforms.determined.master
reads; a login the master refuses is a failed row of cluster.reset, never a silent skip."""

import io
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from harness_helpers import write_inventory
from rich.console import Console

from dtlab import cluster as cluster_module
from dtlab import paths, remote
from dtlab.errors import DtlabError
from dtlab.platforms import determined, load_cluster
from dtlab.platforms.determined import master as detmaster
from tests.trainer.conftest import free_loopback_port

ANSIBLE_PLAYBOOK = paths.REPO_ROOT / ".venv" / "bin" / "ansible-playbook"
MASTER_ROLE = paths.REPO_ROOT / "roles" / "determined_master"


def write_cluster(tmp_path: Path, master_port: int | None = None) -> Path:
    """Master m (run locally by Ansible) and worker w; secrets land in tmp_path/.dtlab/secrets/detadmin."""
    site = "dtlab_cluster_name: detadmin\n"
    site += f"determined_master_port: {master_port}\n" if master_port else ""
    return write_inventory(
        tmp_path,
        """\
        all:
          children:
            master:
              hosts:
                m: {ansible_host: 127.0.0.1, ansible_connection: local}
            workers:
              hosts:
                w: {ansible_host: 127.0.40.2}
        """,
        group_vars={"all": site},
    )


def render_master_yaml(tmp_path: Path, inventory: Path) -> dict:
    """The determined_master role's template, rendered by ansible-playbook with the role's defaults and
    the inventory's group_vars, as site.yml renders it (the admin password lookup creates the secret)."""
    playbook = tmp_path / "render.yml"
    dest = tmp_path / "master.yaml"
    playbook.write_text(yaml.safe_dump([{
        "name": "Render master.yaml",
        "hosts": "master",
        "gather_facts": False,
        "vars_files": [str(MASTER_ROLE / "defaults" / "main.yml")],
        "vars": {"ansible_python_interpreter": "{{ ansible_playbook_python }}"},
        "tasks": [{"name": "Write master.yaml", "ansible.builtin.template": {
            "src": str(MASTER_ROLE / "templates" / "master.yaml.j2"), "dest": str(dest), "mode": "0600"}}],
    }]))
    result = subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", str(inventory), str(playbook)], cwd=paths.REPO_ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return yaml.safe_load(dest.read_text())


@pytest.mark.slow
def test_the_harness_password_is_the_one_rendered_into_master_yaml(tmp_path):
    inventory = write_cluster(tmp_path)
    master_yaml = render_master_yaml(tmp_path, inventory)
    cluster = load_cluster(inventory)
    password = detmaster.admin_password(cluster)
    assert master_yaml["security"]["initial_user_password"] == password
    assert len(password) == 24 and password.isalnum()
    secret_file = detmaster.admin_password_file(cluster)
    assert secret_file.resolve() == (tmp_path / ".dtlab/secrets/detadmin/determined_admin_password").resolve()
    # A second converge keeps the secret: the master's password and the harness's stay the same.
    assert render_master_yaml(tmp_path, inventory)["security"]["initial_user_password"] == password


@pytest.mark.slow
def test_master_yaml_gives_hand_submitted_trials_the_inventorys_trial_image(tmp_path):
    inventory = write_cluster(tmp_path)
    (inventory.parent / "group_vars" / "all" / "site.yml").write_text(
        "dtlab_cluster_name: detadmin\ndetermined_trial_image: registry.example/trial:7\n")
    defaults = render_master_yaml(tmp_path, inventory)["task_container_defaults"]
    assert defaults == {"image": {"cpu": "registry.example/trial:7", "cuda": "registry.example/trial:7"},
                        "force_pull_image": False}


def test_a_missing_password_file_is_one_clear_error(tmp_path):
    cluster = load_cluster(write_cluster(tmp_path))
    with pytest.raises(DtlabError, match=r"^determined: no admin password at .*/determined_admin_password; "
                                         r"`ansible-playbook site\.yml` generates it"):
        detmaster.admin_password(cluster)


# A Determined master that refuses every login, as the real one does for a wrong password (403), and
# appends each POST's path to a file. Run as `python3 -c REFUSING_MASTER PORT LOG_FILE`: here on loopback,
# on the lab's master node in the lab test.
REFUSING_MASTER = """
import http.server, json, sys

class Master(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        with open(sys.argv[2], "a") as log:
            log.write(self.path + "\\n")
        body = json.dumps({"code": 7, "message": "invalid credentials", "details": []}).encode()
        self.send_response(403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

http.server.ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), Master).serve_forever()
"""
LOGIN_PATH = "/api/v1/auth/login"
REFUSED = "ForbiddenException: Forbidden(invalid credentials); experiments not cancelled"


def wait_for_port(address: str, port: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((address, port), timeout=2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.fixture
def sdk_home(tmp_path, monkeypatch):
    """The Determined SDK caches login tokens under HOME: a fresh one per test."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / ".config"))


def write_wrong_password(cluster) -> None:
    secret_file = detmaster.admin_password_file(cluster)
    secret_file.parent.mkdir(parents=True, exist_ok=True)
    secret_file.write_text("NotTheMastersPassword123\n")


def test_a_refused_login_is_a_failed_row_of_reset_not_a_skip(tmp_path, sdk_home):
    """reset's Determined step against a real HTTP master on loopback (the nodes' steps: the lab test)."""
    port, log = free_loopback_port(), tmp_path / "logins"
    master = subprocess.Popen([sys.executable, "-c", REFUSING_MASTER, str(port), str(log)])
    try:
        wait_for_port("127.0.0.1", port)
        cluster = load_cluster(write_cluster(tmp_path, master_port=port))
        write_wrong_password(cluster)
        said: list[str] = []
        rows = determined.cancel_experiments(cluster, said.append)
    finally:
        master.terminate()
        master.wait(timeout=30)
    assert log.read_text().splitlines() == [LOGIN_PATH]
    detail = f"determined: cannot log in as admin at http://127.0.0.1:{port}: {REFUSED}"
    assert rows == [cluster_module.CheckRow("determined login", "m", False, detail)]
    assert len(said) == 1 and "cannot log in as admin" in said[0]


@pytest.mark.lab
@pytest.mark.slow
def test_reset_on_the_lab_reports_a_refused_login_as_a_failed_row(harness_lab, sdk_home):
    """The whole cluster.reset on the lab's nodes, with Determined switched on for this one inventory and a
    master on node0 that refuses the login: the login is reset's first row, failed, and the rest still ran."""
    lab_cluster, _ = harness_lab
    source = Path(lab_cluster.inventory_path)
    document = yaml.safe_load(source.read_text())
    for group in document.values():  # host vars beat group_vars/lab.yml's determined_install_binaries
        for host_vars in (group.get("hosts") or {}).values():
            if isinstance(host_vars, dict):
                host_vars.update(determined_install_binaries=True,
                                 dtlab_cluster_name=f"{host_vars['dtlab_cluster_name']}-refused-login")
    variant = source.with_name(f"{source.stem}-refused-login.yml")  # beside it: the same group_vars
    variant.write_text(yaml.safe_dump(document))
    cluster = load_cluster(variant)
    master, port, log = cluster.master, detmaster.master_port(cluster), "/tmp/dtlab-test-refused-logins"
    unit = "dtlab-test-refusing-login"  # outside reset's unit patterns: reset neither stops nor restarts it
    try:
        write_wrong_password(cluster)
        started = remote.run(master, f"rm -f {log}; systemd-run --unit={unit} --collect /usr/bin/python3 -c "
                                     f"{shlex.quote(REFUSING_MASTER)} {port} {log}")
        assert started.ok, started.stderr
        wait_for_port(master.address, port)
        output = io.StringIO()
        outcome = cluster_module.reset(cluster, console=Console(file=output, width=200))
        logins = remote.run(master, f"cat {log}").stdout.splitlines()
    finally:
        remote.run(master, f"systemctl stop {unit}; rm -f {log}")
        variant.unlink()
        shutil.rmtree(detmaster.admin_password_file(cluster).parent, ignore_errors=True)
    assert logins == [LOGIN_PATH]
    assert outcome.unreachable == [], outcome.unreachable  # every node answered
    rows = outcome.rows
    url = f"http://{master.address}:{port}"
    assert rows[0] == cluster_module.CheckRow(
        "determined login", master.name, False, f"determined: cannot log in as admin at {url}: {REFUSED}")
    assert "cannot log in as admin" in output.getvalue()
    # The other steps ran on every node: only Determined's rows fail (no binaries on the lab).
    assert [row.check for row in cluster_module.failed(rows) if not row.check.startswith("determined")] == []
    answered = {row.node for row in rows if row.check == "ssh" and row.ok}
    assert answered == {node.name for node in cluster.nodes}
