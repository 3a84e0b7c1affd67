"""dtlab.inventory: the cluster as Ansible sees it (group_vars and host_vars apply); bad ones: one line."""

import json
import subprocess

import pytest
from harness_helpers import CPU_CLUSTER_3, CPU_SITE_VARS, GPU_CLUSTER_4X2, write_inventory

from dtlab import inventory, paths, roles
from dtlab.errors import DtlabError
from dtlab.platforms import ddp, determined, load_cluster, spark


def test_example_cluster_inventory_reads_as_the_studys_three_gpu_nodes():
    # Its addresses are documentation placeholders: readable for display (bench.report), never contacted.
    cluster = load_cluster(paths.INVENTORY_DIR / "cluster.example.yml", allow_placeholders=True)
    assert cluster.master.name == "node0"
    assert [w.name for w in cluster.workers] == ["node1", "node2"]
    assert cluster.device == "cuda" and cluster.max_gpus == 2
    assert all(w.gpu_indices == (0,) and w.ssh_user == "ubuntu" for w in cluster.workers)
    # Ports and paths come from group_vars/all.yml, through Ansible's variable precedence.
    assert ddp.rendezvous_port(cluster) == 29500 and spark.master_port(cluster) == 7077
    assert spark.master_webui_port(cluster) == 8090 and determined.master.master_port(cluster) == 8080
    assert cluster.venv_dir == "/opt/dtlab/venv" and cluster.python == "/opt/dtlab/venv/bin/python"
    assert determined.has_master(cluster) and not cluster.is_lab


def test_example_cluster_inventory_is_refused_where_nodes_would_be_contacted():
    with pytest.raises(DtlabError) as refused:
        load_cluster(paths.INVENTORY_DIR / "cluster.example.yml")
    assert str(refused.value) == (
        f"inventory {paths.INVENTORY_DIR / 'cluster.example.yml'}: host node0: ansible_host 192.0.2.10 is a"
        " documentation placeholder (from inventory/cluster.example.yml); set the node's real address"
    )


def test_group_vars_and_host_vars_apply_with_ansibles_precedence(tmp_path):
    path = write_inventory(
        tmp_path,
        GPU_CLUSTER_4X2,
        group_vars={
            "all": "dtlab_cluster_name: four\n",
            "workers": "trainer_pip_index_args: [--pre]\ndtlab_rendezvous_port: 31000\n",
        },
        host_vars={"gpu4": "gpu_indices: [1]\ntrainer_pip_index_args: []\n"},
    )
    cluster = load_cluster(path)
    assert cluster.name == "four"
    assert [w.var("trainer_pip_index_args") for w in cluster.workers] == [["--pre"]] * 3 + [[]]
    assert cluster.node("gpu4").gpu_indices == (1,)
    assert cluster.max_gpus == 7
    assert cluster.node("gpu1").var("dtlab_rendezvous_port") == 31000
    assert cluster.master.var("dtlab_rendezvous_port") == 29500  # the master is not in group workers


def test_a_roles_own_settings_come_from_its_defaults_under_the_inventorys(tmp_path):
    """A setting one role owns lives in its defaults/main.yml, and the harness reads it there, templated
    (spark_connect_env_file names spark_conf_dir), below group_vars and host_vars as in Ansible's play."""
    path = write_inventory(tmp_path, CPU_CLUSTER_3, group_vars={"all": CPU_SITE_VARS},
                           host_vars={"n1": "ray_temp_dir: /srv/ray\n"})
    cluster = load_cluster(path)
    site_vars = (paths.INVENTORY_DIR / "group_vars" / "all.yml").read_text()
    assert "spark_conf_dir:" not in site_vars and "ray_temp_dir:" not in site_vars
    assert cluster.var("spark_conf_dir") == "/etc/spark"
    assert cluster.var("spark_connect_env_file") == "/etc/spark/connect.env"
    assert cluster.require("spark_master_service") == "dtlab-spark-master"
    assert [node.var("ray_temp_dir") for node in cluster.nodes] == ["/var/lib/dtlab/ray", "/srv/ray",
                                                                     "/var/lib/dtlab/ray"]


def test_a_name_two_roles_default_is_refused_in_one_line(tmp_path):
    for role in ("alpha", "beta"):
        (tmp_path / role / "defaults").mkdir(parents=True)
        (tmp_path / role / "defaults" / "main.yml").write_text(f"{role}_own: 1\nshared_path: /srv\n")
    with pytest.raises(DtlabError, match=r"^roles/beta/defaults/main.yml: shared_path is also set in "
                                         r"roles/alpha/defaults/main.yml; keep it in the one role"):
        roles.all_defaults(tmp_path)
    assert roles.all_defaults()["spark_home"] == "/opt/spark"  # the repository's own roles: one owner each


def test_templated_variables_render_and_secret_lookups_do_not_run(tmp_path):
    path = write_inventory(tmp_path, CPU_CLUSTER_3, group_vars={"all": CPU_SITE_VARS})
    cluster = load_cluster(path)
    assert cluster.name == "three"
    assert cluster.var("dtlab_secrets_dir") == f"{tmp_path}/inventory/../.dtlab/secrets/three"
    assert (
        "lookup('ansible.builtin.password'" in cluster.master.hostvars["spark_auth_secret"]
    )  # left unrendered
    assert not (tmp_path / ".dtlab").exists()  # reading never generated a secret
    assert cluster.device == "cpu" and cluster.max_gpus == 2
    assert cluster.socket_env_file == "/etc/dtlab/veth9.env"  # the site file beats group_vars/all.yml


def test_ssh_settings_come_from_the_inventory(tmp_path):
    path = write_inventory(
        tmp_path,
        f"""\
        all:
          vars:
            ansible_user: admin
            ansible_port: 2222
            ansible_ssh_private_key_file: "{{{{ inventory_dir }}}}/id_test"
            ansible_ssh_common_args: -o UserKnownHostsFile={tmp_path}/kh -o StrictHostKeyChecking=yes
          children:
            master: {{hosts: {{m: {{ansible_host: 127.0.30.1}}}}}}
            workers: {{hosts: {{w: {{ansible_host: 127.0.30.2}}}}}}
        """,
    )
    (path.parent / "id_test").write_text("not a real key")
    node = load_cluster(path).node("w")
    assert (node.ssh_user, node.ssh_port, node.ssh_key) == ("admin", 2222, f"{tmp_path}/inventory/id_test")
    assert node.known_hosts_file == f"{tmp_path}/kh"


def test_default_inventory_is_ansible_cfgs_and_ansible_inventory_overrides(monkeypatch, tmp_path):
    monkeypatch.delenv("ANSIBLE_INVENTORY", raising=False)
    monkeypatch.delenv("ANSIBLE_CONFIG", raising=False)
    assert inventory.default_inventory_path() == paths.REPO_ROOT / "inventory" / "lab.yml"
    path = write_inventory(tmp_path, CPU_CLUSTER_3)
    monkeypatch.setenv("ANSIBLE_INVENTORY", str(path))
    assert inventory.default_inventory_path() == path
    assert load_cluster().inventory_path == path


def _ansible_inventory_hosts(cwd) -> list[str]:
    """What Ansible itself reads as the default inventory in this environment (its own CLI, no -i)."""
    answer = subprocess.run([str(paths.REPO_ROOT / ".venv/bin/ansible-inventory"), "--list"], cwd=cwd,
                            capture_output=True, text=True, timeout=120)
    assert answer.returncode == 0, answer.stderr[-2000:]
    return sorted(json.loads(answer.stdout)["_meta"]["hostvars"])


def test_the_inventory_setting_is_found_as_ansible_finds_it(monkeypatch, tmp_path):
    """ANSIBLE_CONFIG (a file, or a folder holding ansible.cfg), then ./ansible.cfg; a relative
    `inventory =` is relative to its file, a relative ANSIBLE_INVENTORY to the working directory."""
    monkeypatch.delenv("ANSIBLE_INVENTORY", raising=False)
    site = tmp_path / "site"
    path = write_inventory(site, CPU_CLUSTER_3)  # site/inventory/hosts.yml
    (site / "ansible.cfg").write_text("[defaults]\ninventory = inventory/hosts.yml\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)

    monkeypatch.setenv("ANSIBLE_CONFIG", str(site / "ansible.cfg"))
    assert inventory.default_inventory_path() == path
    assert load_cluster().inventory_path == path
    assert _ansible_inventory_hosts(elsewhere) == ["n0", "n1", "n2"], "Ansible reads the same inventory"
    monkeypatch.setenv("ANSIBLE_CONFIG", str(site))  # a folder: its ansible.cfg, as Ansible does
    assert inventory.default_inventory_path() == path

    monkeypatch.delenv("ANSIBLE_CONFIG")
    monkeypatch.chdir(site)  # ./ansible.cfg
    assert inventory.default_inventory_path() == path
    monkeypatch.chdir(elsewhere)  # none here: the repository's, where `ansible-playbook site.yml` runs
    assert inventory.default_inventory_path() == paths.REPO_ROOT / "inventory" / "lab.yml"

    other = write_inventory(elsewhere, GPU_CLUSTER_4X2)
    monkeypatch.setenv("ANSIBLE_CONFIG", str(site / "ansible.cfg"))
    monkeypatch.setenv("ANSIBLE_INVENTORY", "inventory/hosts.yml")  # beats the file; relative to here
    assert inventory.default_inventory_path() == other
    assert _ansible_inventory_hosts(elsewhere) == ["gpu1", "gpu2", "gpu3", "gpu4", "head"]


def test_a_config_without_an_inventory_or_naming_a_missing_one_is_one_line(monkeypatch, tmp_path):
    monkeypatch.delenv("ANSIBLE_INVENTORY", raising=False)
    config = tmp_path / "ansible.cfg"
    monkeypatch.setenv("ANSIBLE_CONFIG", str(config))
    config.write_text("[defaults]\nforks = 5\n")
    with pytest.raises(DtlabError) as refused:
        load_cluster()
    assert str(refused.value) == f"{config}: no `inventory =` line in [defaults]; add one or pass -i"
    config.write_text("[defaults]\ninventory = clusters/mine.yml\n")
    with pytest.raises(DtlabError) as refused:
        load_cluster()
    assert str(refused.value) == (
        f"inventory {tmp_path}/clusters/mine.yml: no such file; check the path given to -i/--inventory"
        " or ansible.cfg's `inventory =` line"
    )


# Each bad inventory, and that load_cluster and site.yml's first play refuse it with the same line:
# tests/provision/test_validate.py.


def test_a_missing_inventory_says_what_to_do(tmp_path):
    with pytest.raises(DtlabError, match=r"no such file; run `invoke lab.up` to create it"):
        load_cluster(tmp_path / "lab-nothere.yml")
    with pytest.raises(DtlabError, match="no such file; check the path given to -i/--inventory"):
        load_cluster(tmp_path / "mycluster.yml")


def test_reading_writes_nothing_beside_the_inventory(tmp_path):
    path = write_inventory(tmp_path, CPU_CLUSTER_3.replace("127.0.20.", "127.0.66."))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    load_cluster(path)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
