"""The harness logs in to Determined with the password the master was given: the generated secret that
Ansible renders into master.yaml (initial_user_password) is the file dtlab.detmaster reads; a login the
master refuses is a failed row of cluster.reset, never a silent skip."""

import http.server
import io
import json
import subprocess
import threading
from pathlib import Path

import pytest
import yaml
from harness_helpers import write_inventory
from rich.console import Console

from dtlab import cluster as cluster_module
from dtlab import detmaster, paths, probes, remote
from dtlab.errors import DtlabError
from dtlab.inventory import load_cluster

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


def test_a_missing_password_file_is_one_clear_error(tmp_path):
    cluster = load_cluster(write_cluster(tmp_path))
    with pytest.raises(DtlabError, match=r"^determined: no admin password at .*/determined_admin_password; "
                                         r"`ansible-playbook site\.yml` generates it"):
        detmaster.admin_password(cluster)


class RefusingMaster(http.server.BaseHTTPRequestHandler):
    """A Determined master that refuses every login, as the real one does for a wrong password (403)."""

    requests: list[str] = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        type(self).requests.append(self.path)
        body = json.dumps({"code": 7, "message": "invalid credentials", "details": []}).encode()
        self.send_response(403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class Done:
    ok, exit_code, stdout, stderr = True, 0, "", ""


def test_reset_reports_a_refused_login_as_a_failed_row(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # the SDK's token cache
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / ".config"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RefusingMaster)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cluster = load_cluster(write_cluster(tmp_path, master_port=server.server_address[1]))
        secret_file = detmaster.admin_password_file(cluster)
        secret_file.parent.mkdir(parents=True)
        secret_file.write_text("NotTheMastersPassword123\n")
        # Everything but the Determined login is out of scope here: the nodes answer "done".
        monkeypatch.setattr(remote, "run_all", lambda nodes, *args, **kwargs: {n.name: Done() for n in nodes})
        monkeypatch.setattr(remote, "run", lambda *args, **kwargs: Done())
        monkeypatch.setattr(probes, "wait_for_spark", lambda cluster, expected, timeout_s: 0)
        monkeypatch.setattr(cluster_module, "check", lambda cluster: [
            cluster_module.CheckRow("ssh", node.name, True, "ok") for node in cluster.nodes])
        output = io.StringIO()
        rows = cluster_module.reset(cluster, console=Console(file=output, width=200))
    finally:
        server.shutdown()
        server.server_close()
    assert RefusingMaster.requests == ["/api/v1/auth/login"]
    url = f"http://127.0.0.1:{server.server_address[1]}"
    assert cluster_module.failed(rows) == [rows[0]]
    assert rows[0].check == "determined login" and rows[0].node == "m"
    assert rows[0].detail == (f"determined: cannot log in as admin at {url}: ForbiddenException:"
                              " Forbidden(invalid credentials); experiments not cancelled")
    assert "cannot log in as admin" in output.getvalue()
