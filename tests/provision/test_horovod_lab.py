"""The horovod role on the session's test lab, after its one full converge: `site.yml --tags horovod` with
horovod_install true builds the wheel on the controller into the wheelhouse the nodes mount (or finds it
there: tests/provision/test_horovod_build.py leaves it), installs it into every node's trainer venv, and the
service user can run horovodrun with PyTorch and Gloo on a worker. A second run changes nothing."""

import shlex

import pytest

from dtlab import provision
from dtlab.inventory import load_cluster
from dtlab.lab.access import run_on_node
from tests.provision.test_horovod_build import missing_compiler

# Both runs, the wheel already built: 139 s on 2 cores; a cold wheelhouse adds its build (about 5 min).
pytestmark = [pytest.mark.lab, pytest.mark.slow, pytest.mark.timeout(3600)]

HOROVOD = {"horovod_install": True}


def test_the_role_installs_horovod_that_the_service_user_runs_on_a_worker(provisioned_lab):
    lab, _ = provisioned_lab
    cluster = load_cluster(lab.inventory_path)
    installed = provision.converge(lab.inventory_path, tags=["horovod"], extravars=HOROVOD)
    if not installed.ok and missing_compiler(installed.output):
        pytest.skip(missing_compiler(installed.output))
    assert installed.ok, installed.summary() + installed.output[-4000:]
    assert "TASK [horovod : Install the Horovod wheel into the trainer venv]" in installed.output

    worker = cluster.workers[0].name
    horovodrun = shlex.quote(f"{cluster.venv_dir}/bin/horovodrun")
    checked = run_on_node(lab, worker, f"runuser -u {cluster.user} -- {horovodrun} --check-build",
                          timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    lines = [line.strip() for line in checked.stdout.splitlines()]
    assert "[X] PyTorch" in lines, checked.stdout
    assert lines.count("[X] Gloo") == 2, checked.stdout  # the controller and the tensor operations

    again = provision.converge(lab.inventory_path, tags=["horovod"], extravars=HOROVOD)
    assert again.ok, again.summary()
    assert again.changed_hosts == {}, again.summary()
