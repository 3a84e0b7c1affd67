"""Fast provisioning checks: the playbooks parse, lint clean, and every role has the same shape."""

import subprocess

import pytest
import yaml

from dtlab import paths

ROLES = ["common", "ssh", "firewall", "nvidia", "docker", "postgresql", "spark", "ray", "slurm",
         "determined_master", "determined_agent", "trainer"]
STAGE_TAGS = ["common", "ssh", "firewall", "nvidia", "docker", "trainer", "postgresql", "spark", "ray",
              "slurm", "determined"]
VENV_BIN = paths.REPO_ROOT / ".venv" / "bin"
EXAMPLE_INVENTORY = paths.INVENTORY_DIR / "cluster.example.yml"


def run(argv, timeout=300):
    return subprocess.run([str(a) for a in argv], cwd=paths.REPO_ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_site_playbook_syntax_check_passes():
    result = run([VENV_BIN / "ansible-playbook", "-i", EXAMPLE_INVENTORY, "site.yml", "--syntax-check"])
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow  # over 10 s on 2 cores: not in `invoke test --fast`
def test_ansible_lint_production_profile_is_clean():
    result = run([VENV_BIN / "ansible-lint", "--nocolor", "-f", "pep8", "--profile", "production"],
                 timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Profile 'production' was required, and it passed" in result.stderr + result.stdout


def test_site_lists_one_tag_per_component_in_install_order():
    result = run([VENV_BIN / "ansible-playbook", "-i", EXAMPLE_INVENTORY, "site.yml", "--list-tags"])
    assert result.returncode == 0, result.stderr
    for tag in STAGE_TAGS:
        assert tag in result.stdout
    imported = [step["ansible.builtin.import_playbook"] for step in
                yaml.safe_load((paths.REPO_ROOT / "site.yml").read_text())]
    assert imported[0] == "ansible/validate.yml"
    # Spark runs the venv's pyspark and Ray the venv's ray; Determined needs its database.
    assert imported.index("ansible/trainer.yml") < imported.index("ansible/spark.yml")
    assert imported.index("ansible/trainer.yml") < imported.index("ansible/ray.yml")
    assert imported.index("ansible/postgresql.yml") < imported.index("ansible/determined.yml")
    # The firewall stands before any service opens a port (issue #27).
    assert imported.index("ansible/ssh.yml") < imported.index("ansible/firewall.yml")
    assert all(imported.index("ansible/firewall.yml") < imported.index(f"ansible/{stage}.yml")
               for stage in ("trainer", "postgresql", "spark", "ray", "slurm", "determined"))
    # Slurm, the fifth platform, comes after Ray and before Determined (issue #16).
    assert imported.index("ansible/ray.yml") < imported.index("ansible/slurm.yml")
    assert imported.index("ansible/slurm.yml") < imported.index("ansible/determined.yml")


@pytest.mark.parametrize("role", ROLES)
def test_role_has_documented_interface(role):
    role_dir = paths.REPO_ROOT / "roles" / role
    defaults = yaml.safe_load((role_dir / "defaults/main.yml").read_text()) or {}
    specs = yaml.safe_load((role_dir / "meta/argument_specs.yml").read_text())
    specs = specs["argument_specs"]["main"]["options"]
    for name in defaults:
        assert name.startswith(f"{role}_"), f"{role}: default {name} lacks the role prefix"
        assert name in specs, f"{role}: default {name} missing from meta/argument_specs.yml"
    assert (role_dir / "handlers/main.yml").exists()
    readme = (role_dir / "README.md").read_text()
    order = [readme.index(heading) for heading in
             ("## Requirements", "## Role Variables", "## Dependencies", "## Example Playbook")]
    assert order == sorted(order), f"{role}: README sections out of the geerlingguy order"


def test_distribution_specific_values_live_in_vars_files():
    for role_dir in (paths.REPO_ROOT / "roles").iterdir():
        for tasks_file in (role_dir / "tasks").glob("*.yml"):
            assert "ansible_distribution ==" not in tasks_file.read_text(), tasks_file
            assert "is lab" not in tasks_file.read_text(), tasks_file


def test_generated_secrets_stay_out_of_git():
    ignored = run(["git", "check-ignore", "-q", ".dtlab/secrets/cluster/determined_db_password"])
    assert ignored.returncode == 0, "the secrets directory must be git-ignored"
