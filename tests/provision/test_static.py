"""Fast provisioning checks: the playbooks parse, lint clean, and every role has the same shape and
declares every variable it reads."""

import os
import re
import subprocess
import warnings
from pathlib import Path

import jinja2
import jinja2.nodes
import pytest
import yaml

from dtlab import paths, pins

# Every role: site.yml's stages, and those the others import (systemd_units, determined_common).
ROLES = sorted(path.name for path in (paths.REPO_ROOT / "roles").iterdir() if path.is_dir())
STAGE_TAGS = ["common", "ssh", "firewall", "nvidia", "docker", "trainer", "postgresql", "spark", "ray",
              "slurm", "determined", "horovod"]
VENV_BIN = paths.REPO_ROOT / ".venv" / "bin"
EXAMPLE_INVENTORY = paths.INVENTORY_DIR / "cluster.example.yml"


def run(argv, timeout=300):
    return subprocess.run([str(a) for a in argv], cwd=paths.REPO_ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_site_playbook_syntax_check_passes():
    result = run([VENV_BIN / "ansible-playbook", "-i", EXAMPLE_INVENTORY, "site.yml", "--syntax-check"])
    assert result.returncode == 0, result.stdout + result.stderr


# ansible-lint's production profile runs as one of `invoke test`'s linters (dtlab/commands.py LINTERS),
# beside pytest: a test here ran it a second time (a minute on 2 cores).


def test_site_lists_one_tag_per_component_in_install_order():
    result = run([VENV_BIN / "ansible-playbook", "-i", EXAMPLE_INVENTORY, "site.yml", "--list-tags"])
    assert result.returncode == 0, result.stderr
    for tag in STAGE_TAGS:
        assert tag in result.stdout
    # One play per component, in install order, each named by its first tag (validate: the checks' play).
    plays = yaml.safe_load((paths.REPO_ROOT / "site.yml").read_text())
    stages = [next(tag for tag in play["tags"] if tag != "always")
              for play in plays if play["tags"] != ["always"]]  # the secrets' play: always, no tag of its own
    assert stages[0] == "validate" and stages.count("determined") == 2  # its master's play, its agents'
    order = {stage: stages.index(stage) for stage in stages}
    # Spark runs the venv's pyspark and Ray the venv's ray; Determined needs its database.
    assert order["trainer"] < order["spark"] and order["trainer"] < order["ray"]
    assert order["postgresql"] < order["determined"]
    # The firewall stands before any service opens a port (issue #27).
    assert order["ssh"] < order["firewall"]
    assert all(order["firewall"] < order[stage]
               for stage in ("trainer", "postgresql", "spark", "ray", "slurm", "determined"))
    # Slurm, the fifth platform, comes after Ray and before Determined (issue #16).
    assert order["ray"] < order["slurm"] < order["determined"]
    # Horovod goes into the trainer venv, last: a compile under way gets every other play's time (issue #50).
    assert order["horovod"] == len(stages) - 1 and order["trainer"] < order["horovod"]
    assert not (paths.REPO_ROOT / "ansible").exists()  # the stage playbooks are site.yml's plays (#56)


@pytest.mark.parametrize("role", ROLES)
def test_role_has_documented_interface(role):
    role_dir = paths.REPO_ROOT / "roles" / role
    defaults = yaml.safe_load((role_dir / "defaults/main.yml").read_text()) or {}
    specs = declared(role_dir)
    for name in defaults:
        assert name.startswith(f"{role}_"), f"{role}: default {name} lacks the role prefix"
        assert name in specs, f"{role}: default {name} missing from meta/main.yml's argument_specs"
    # One place for the spec (Ansible also reads meta/argument_specs.yml); no empty handlers file.
    assert not (role_dir / "meta/argument_specs.yml").exists()
    handlers = role_dir / "handlers/main.yml"
    assert not handlers.exists() or yaml.safe_load(handlers.read_text()), f"{role}: empty handlers/main.yml"
    readme = (role_dir / "README.md").read_text()
    order = [readme.index(heading) for heading in
             ("## Requirements", "## Role Variables", "## Dependencies", "## Example Playbook")]
    assert order == sorted(order), f"{role}: README sections out of the geerlingguy order"
    shown = re.search(r"## Role Variables.*?```yaml\n(.*?)```", readme, re.S)
    assert shown, f"{role}: README shows no defaults under Role Variables"
    defaults_text = (role_dir / "defaults/main.yml").read_text().removeprefix("---\n")
    assert shown.group(1).strip() == defaults_text.strip(), f"{role}: README shows other defaults"


def test_no_role_reaches_outside_itself():
    """A role gets the repository's files through a variable (dtlab_repo_dir), not by its own path."""
    for path in sorted((paths.REPO_ROOT / "roles").rglob("*")):
        if path.suffix in (".yml", ".j2"):
            assert "role_path" not in path.read_text(), f"{path}: role_path (give the role a variable)"


# --- every variable a role reads is declared in its meta/main.yml's argument_specs ------------------------

# Names only parsed here, never rendered: every filter and test passes (Ansible's are not Jinja's).
class _AnyName(dict):
    def __contains__(self, name):
        return True

    def get(self, name, default=None):
        return str


JINJA = jinja2.Environment(extensions=["jinja2.ext.do", "jinja2.ext.loopcontrols"])
JINJA.filters, JINJA.tests = _AnyName(), _AnyName()
# Ansible's own: magic variables (facts, connection and magic ansible_* too) and template globals.
ANSIBLE_NAMES = {"inventory_hostname", "inventory_hostname_short", "groups", "group_names", "hostvars",
                 "play_hosts", "role_path", "role_name", "playbook_dir", "inventory_dir", "omit", "item",
                 "lookup", "query", "q", "now", "undef", "range", "dict", "lipsum", "cycler", "joiner",
                 "namespace"}
# Keywords whose strings Ansible evaluates as bare expressions, without {{ }}.
EXPRESSION_KEYWORDS = {"when", "changed_when", "failed_when", "until", "that"}
# Read but not declared: computed from the facts, and a tagged run (--tags x) validates every role's
# arguments also in the plays whose fact gathering it skips, where this one cannot be computed.
READ_FROM_FACTS = {"dtlab_node_socket_ifname"}


def jinja_reads(text):
    """The variables a template or expression reads: every name it loads, less the names it sets itself."""
    with warnings.catch_warnings():  # regexes such as '\.' in Jinja string literals: Ansible's to render
        warnings.simplefilter("ignore", DeprecationWarning)
        found = list(JINJA.parse(text).find_all(jinja2.nodes.Name))
    return {n.name for n in found if n.ctx == "load"} - {n.name for n in found if n.ctx != "load"} - {"loop"}


def yaml_reads(node, reads, sets, key=None):
    """Add what a tasks, handlers, defaults or vars document reads to `reads`, and what it sets to `sets`:
    registered results, set_fact names, task and block vars, loop variables."""
    if isinstance(node, dict):
        sets.update([node["register"]] if "register" in node else [])
        for keyword in ("set_fact", "ansible.builtin.set_fact", "vars"):
            sets.update(node[keyword] if isinstance(node.get(keyword), dict) else [])
        loop_control = node.get("loop_control")
        sets.update([loop_control.get("loop_var")] if isinstance(loop_control, dict) else [])
        for child_key, child in node.items():
            yaml_reads(child, reads, sets, child_key)
    elif isinstance(node, list):
        for child in node:
            yaml_reads(child, reads, sets, key)
    elif isinstance(node, str) and key in EXPRESSION_KEYWORDS:
        reads.update(jinja_reads("{{ (" + node + ") }}"))
    elif isinstance(node, str) and ("{{" in node or "{%" in node):
        reads.update(jinja_reads(node))


def role_reads(role_dir: Path) -> set:
    """Every variable a role reads that it neither sets itself (vars/, register, set_fact, vars:, loops)
    nor gets from Ansible."""
    reads, sets = set(), set()
    for part in ("tasks", "handlers", "defaults", "vars"):
        for path in sorted((role_dir / part).glob("*.yml")):
            document = yaml.safe_load(path.read_text())
            sets.update(document if part == "vars" and isinstance(document, dict) else [])
            yaml_reads(document, reads, sets)
    for path in sorted((role_dir / "templates").rglob("*.j2")):
        reads.update(jinja_reads(path.read_text()))
    sets.discard(None)
    return {name for name in reads - sets if not name.startswith("ansible_") and name not in ANSIBLE_NAMES}


def declared(role_dir: Path) -> set:
    return set(yaml.safe_load((role_dir / "meta/main.yml").read_text())
               ["argument_specs"]["main"]["options"])


@pytest.mark.parametrize("role", ROLES)
def test_role_declares_every_variable_it_reads(role):
    role_dir = paths.REPO_ROOT / "roles" / role
    undeclared = role_reads(role_dir) - declared(role_dir) - READ_FROM_FACTS
    assert not undeclared, f"{role} reads {sorted(undeclared)}, undeclared in meta/main.yml's argument_specs"
    defaults = yaml.safe_load((role_dir / "defaults/main.yml").read_text()) or {}
    unread = declared(role_dir) - role_reads(role_dir) - set(defaults)
    assert not unread, f"{role}: meta/main.yml's argument_specs declare {sorted(unread)}, never read"


def test_the_trainer_roles_lists_refuse_a_repo_dir_that_is_no_checkout_in_one_line(tmp_path):
    from ansible.errors import AnsibleFilterError

    from plugins.filter.dtlab_python import dtlab_node_imports, dtlab_node_packages

    for read in (dtlab_node_packages, dtlab_node_imports):
        with pytest.raises(AnsibleFilterError) as refused:
            read(str(tmp_path))
        assert str(refused.value).startswith(f"dtlab_repo_dir {tmp_path} has no pyproject.toml: it must be")
        assert "\n" not in str(refused.value)


@pytest.mark.slow
def test_a_tagged_run_validates_every_role_without_facts(tmp_path):
    """`--tags <stage>` still checks every role's arguments (the check is tagged always), in plays whose fact
    gathering it skips: every declared variable must render without facts (READ_FROM_FACTS is why one is
    not declared). Check mode on the controller, which no task touches."""
    inventory_dir = tmp_path / "inventory"
    inventory_dir.mkdir()
    (inventory_dir / "group_vars").symlink_to(paths.INVENTORY_DIR / "group_vars")
    # dtlab_repo_dir is the inventory's parent: the pins, and the lists the trainer role's filters read there
    for name in ("constraints.txt", "pyproject.toml", "dtlab"):
        (tmp_path / name).symlink_to(paths.REPO_ROOT / name)
    (inventory_dir / "hosts.yml").write_text(
        "all:\n  children:\n    master:\n      hosts:\n        controller:\n"
        "          ansible_host: 127.0.0.1\n          ansible_connection: local\n"
        "          ansible_python_interpreter: /usr/bin/python3\n          gpu_indices: [0]\n"
        "    workers:\n      hosts:\n        controller:\n")
    env = {**os.environ, "ANSIBLE_CACHE_PLUGIN": "memory", "ANSIBLE_NOCOLOR": "1"}
    result = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory_dir / "hosts.yml"), "site.yml", "--check",
         "--tags", "no_such_stage"],
        cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "Gathering Facts" not in result.stdout
    for role in ROLES:
        assert f"TASK [{role} : Validating arguments against arg spec 'main'" in result.stdout, role


def test_the_variable_check_finds_an_undeclared_read(tmp_path):
    """The check above bites: a read in a task, a template or a condition is found; what the role sets
    itself (register, set_fact, vars:, loop_var, vars/) and Ansible's own names are not."""
    role_dir = tmp_path / "demo"
    for part, text in {
        "tasks/main.yml": "- ansible.builtin.command: {argv: [echo, '{{ demo_port }}']}\n"
                          "  register: demo_result\n"
                          "  when: demo_enabled and demo_result is not defined and inventory_hostname\n"
                          "- ansible.builtin.set_fact: {demo_fact: '{{ demo_result.stdout }}'}\n"
                          "- ansible.builtin.debug: {msg: '{{ demo_local ~ each ~ demo_fact }}'}\n"
                          "  vars: {demo_local: '{{ ansible_facts.hostname }}'}\n"
                          "  loop: '{{ demo_list }}'\n  loop_control: {loop_var: each}\n",
        "vars/main.yml": "demo_internal: '{{ demo_from_group_vars }}'\n",
        "defaults/main.yml": "demo_list: [1]\n",
        "templates/demo.j2": "{% for x in demo_items %}{{ x }}{% set y = 1 %}{{ y }}{% endfor %}"
                             "{{ demo_internal }}",
    }.items():
        (role_dir / part).parent.mkdir(parents=True, exist_ok=True)
        (role_dir / part).write_text(text)
    assert role_reads(role_dir) == {"demo_port", "demo_enabled", "demo_list", "demo_from_group_vars",
                                    "demo_items"}


def test_distribution_specific_values_live_in_vars_files():
    for role_dir in (paths.REPO_ROOT / "roles").iterdir():
        for tasks_file in (role_dir / "tasks").glob("*.yml"):
            assert "ansible_distribution ==" not in tasks_file.read_text(), tasks_file
            assert "is lab" not in tasks_file.read_text(), tasks_file


def test_generated_secrets_stay_out_of_git():
    ignored = run(["git", "check-ignore", "-q", ".dtlab/secrets/cluster/determined_db_password"])
    assert ignored.returncode == 0, "the secrets directory must be git-ignored"


def test_the_nodes_get_the_trainers_dependencies_and_each_platforms_client():
    # One list each: pyproject.toml's dependencies and each platform class's python_client, which the
    # trainer role's default and the offline bundle read through dtlab.pins (a second copy in the role once
    # missed nvidia-ml-py on the nodes); the platforms' node_imports join its bytecode list so.
    import tomllib

    from plugins.filter.dtlab_python import dtlab_node_imports, dtlab_node_packages

    project = tomllib.loads((paths.REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert not set(project["optional-dependencies"]) & set(paths.platform_names()), "a client is a class's"
    declared = pins.platform_declarations()
    assert sorted(declared) == sorted(paths.platform_names())
    clients = [requirement for name in sorted(declared) for requirement in declared[name]["python_client"]]
    assert clients == pins.platform_clients() and "pyspark[connect]>=4.0,<5" in clients
    # A requirement's name with its extras, without the version range: "ray[default,train]>=2.60" -> ray[...].
    name = re.compile(r"[A-Za-z0-9_.\-]+(\[[^\]]*\])?")
    names = [name.match(requirement).group(0).lower() for requirement in project["dependencies"] + clients]
    assert pins.node_packages() == names == dtlab_node_packages(str(paths.REPO_ROOT))
    assert "pyspark[connect]" in names and not {"ansible", "pytest", "accelerate"} & set(names)
    assert "ray.train.torch" in pins.node_imports() == dtlab_node_imports(str(paths.REPO_ROOT))
    defaults = yaml.safe_load((paths.REPO_ROOT / "roles/trainer/defaults/main.yml").read_text())
    assert defaults["trainer_python_packages"] == "{{ dtlab_repo_dir | dtlab_node_packages }}"
    read = "{{ trainer_core_imports + (dtlab_repo_dir | dtlab_node_imports) }}"
    assert defaults["trainer_bytecode_imports"] == read
    assert not set(defaults["trainer_core_imports"]) & set(pins.node_imports())
