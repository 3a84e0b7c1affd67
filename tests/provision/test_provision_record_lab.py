"""A real converge records its seconds per role (results/<cluster>/provision/), and the report reads
them: the session's first converge of the test lab (tests/conftest.py `provisioned_lab`), no other."""

import json
import os

import pytest

from dtlab.paths import PROVISION_DIRNAME, results_dir_for
from dtlab.provision import OUTSIDE_ROLES
from dtlab.report.comparison import PLATFORM_ROLES, provisioning_times, shared_roles

pytestmark = [pytest.mark.lab, pytest.mark.slow, pytest.mark.timeout(3600)]


def test_the_first_converge_records_its_seconds_per_role(provisioned_lab):
    lab, first = provisioned_lab
    directory = results_dir_for(lab.cluster_name) / PROVISION_DIRNAME
    # The session's one converge may run before a harness test points the results folder elsewhere:
    # the record lies under results/<cluster>/provision/ of whichever folder was current then.
    assert first.record is not None, first.summary()
    assert first.record.parent.parts[-2:] == directory.parts[-2:], first.summary()
    record = json.loads(first.record.read_text())
    assert record["cluster"] == lab.cluster_name and record["changed"] is bool(first.changed_hosts)
    roles = record["roles"]
    for role in ("common", "firewall", "trainer", *(r for rs in PLATFORM_ROLES.values() for r in rs)):
        assert roles[role]["tasks"] > 0 and roles[role]["seconds"] > 0, role
    if os.environ.get("DTLAB_TEST_LAB_KEEP") != "1":  # fresh nodes, the fixture's default
        assert record["changed"] is True and roles["spark"]["changed"] > 0, "the spark role installed Spark"
    assert set(roles["spark"]["hosts"]) == set(lab.node_names)
    # The role spark, ray and slurm import for their units counts for each of them, not on its own.
    assert "systemd_units" not in roles and roles["spark"]["imported"]["systemd_units"] > 0
    # The roles' wall times add up to the run (the rest: Ansible starting, the plays' own set-up).
    assert 0.5 * record["seconds"] < sum(r["seconds"] for r in roles.values()) <= record["seconds"]
    shown, shared = provisioning_times([record])
    assert shown["spark"].endswith("s with changes (1 run)"), shown
    # Which stage is a platform's: tests/report/test_comparison.py; here, that the record feeds the line.
    common = shared_roles(roles)
    assert {"common", "firewall", "trainer", OUTSIDE_ROLES} <= set(common) and "spark" not in common
    assert shared.startswith(f"Shared roles ({', '.join(common)}): ") and "with changes (1 run)" in shared
