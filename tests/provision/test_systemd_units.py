"""roles/systemd_units at unit level, in check mode on the controller (nothing is written): an owner role
imports it with a unit from the owner's own template and one as data (the role's service.j2), the owner's
configuration task notifies "Restart <owner>" by name, the handlers run owner's first, then the reload,
then the restart, and a unit systemd does not know yet is neither restarted nor started. The lab
converges spark, ray and slurm through it for real (test_lab_converge)."""

import os
import re
import subprocess

import pytest

from dtlab import paths

ANSIBLE_PLAYBOOK = paths.REPO_ROOT / ".venv" / "bin" / "ansible-playbook"
UNIT_TEXT = "[Service]\nExecStart=/bin/true\n"

pytestmark = pytest.mark.slow  # an ansible-playbook run: not in `invoke test --fast`


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def owner_run(tmp_path):
    """A stand-in service role, demo, that imports systemd_units as spark, ray and slurm do; check mode."""
    role = tmp_path / "roles" / "demo"
    write(role / "templates" / "dtlab-demo.service.j2", UNIT_TEXT)
    write(role / "handlers" / "main.yml",
          "- name: Restart demo first\n  ansible.builtin.debug: {msg: demo's own handler}\n")
    write(role / "tasks" / "main.yml", f"""\
- name: Write demo's configuration
  ansible.builtin.copy: {{content: "demo\\n", dest: "{tmp_path}/demo.conf", mode: "0644"}}
  notify: [Restart demo first, Restart demo]
- name: Install, reload, restart and run demo's unit
  ansible.builtin.import_role: {{name: systemd_units}}
  vars:
    systemd_units_owner: demo
    systemd_units_files:
      - {{name: dtlab-demo-test, template: dtlab-demo.service.j2}}
      - name: dtlab-demo-data
        unit:
          description: demo as data
          environment: {{DEMO_PORT: 7, DEMO_HOME: /opt/demo}}
          exec_start_pre: ["-/bin/sh -c 'echo before'"]
          exec_start: /bin/true --data
          success_exit_status: 143
    systemd_units_dir: "{tmp_path}/units"
""")
    write(tmp_path / "play.yml", "- hosts: localhost\n  gather_facts: false\n  vars: {dtlab_user: nobody}\n"
                                 "  roles: [demo]\n")
    env = {**os.environ, "ANSIBLE_ROLES_PATH": f"{tmp_path / 'roles'}:{paths.REPO_ROOT / 'roles'}",
           "ANSIBLE_CACHE_PLUGIN": "memory", "ANSIBLE_NOCOLOR": "1"}
    result = subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "-i", "localhost,", "-c", "local",
         "-e", "ansible_python_interpreter=/usr/bin/python3", str(tmp_path / "play.yml"), "--check",
         "--diff"],
        cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    return tmp_path, result.stdout


def test_the_unit_comes_from_the_owners_template(owner_run):
    tmp_path, out = owner_run
    written = out[out.index("TASK [systemd_units : Install the unit files]"):].split("\n\n")[0]
    assert re.search(r"^\+\+\+ after: \S+/dtlab-demo\.service\.j2$", written, re.M), written  # demo's
    assert "+ExecStart=/bin/true" in written, written
    assert "changed: [localhost] => (item=dtlab-demo-test)" in out, out[-3000:]
    assert not (tmp_path / "units").exists() and not (tmp_path / "demo.conf").exists()  # check mode


def test_a_unit_as_data_is_rendered_by_the_roles_own_template(owner_run):
    _, out = owner_run
    task = out[out.index("TASK [systemd_units : Install the unit files]"):]
    # systemd_units' own template: Ansible shows the path of its temporary copy, named as the template
    assert re.search(r"^\+\+\+ after: \S+/service\.j2$", task, re.M), task
    written = task[task.index("/service.j2\n"):].split("\n\n")[0]
    unit = [line[1:] for line in written.splitlines() if line.startswith("+") and not line.startswith("+++")]
    service = unit[unit.index("[Service]"):]
    assert "Description=demo as data" in unit and "User=nobody" in service, unit
    assert service[3:8] == ["Environment=DEMO_PORT=7", "Environment=DEMO_HOME=/opt/demo",
                            "ExecStartPre=-/bin/sh -c 'echo before'", "ExecStart=/bin/true --data",
                            "Restart=on-failure"], service
    assert "SuccessExitStatus=143" in service and not any(line.startswith("TimeoutStopSec") for line in unit)


def test_handlers_run_owners_first_then_reload_then_restart(owner_run):
    _, out = owner_run
    order = [out.index(f"RUNNING HANDLER [{name}]") for name in
             ("demo : Restart demo first", "systemd_units : Reload systemd units",
              "systemd_units : Restart demo")]
    assert order == sorted(order), out[-3000:]


def test_a_unit_systemd_does_not_know_yet_is_left_alone_in_check_mode(owner_run):
    _, out = owner_run
    for step in ("RUNNING HANDLER [systemd_units : Restart demo]",
                 "TASK [systemd_units : Run the units now and at boot]"):
        section = out[out.index(step):].split("\n\n")[0]
        assert "skipping: [localhost] => (item=dtlab-demo-test)" in section, section
        assert "ok: [localhost]" not in section and "changed: [localhost]" not in section, section
