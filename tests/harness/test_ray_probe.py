"""dtlab's Ray probes (cluster.check, preflight, cluster.reset) against a real Ray head on 127.0.0.1 with
token authentication: the command the harness runs on the master, run here, parsed as the harness does."""

import json
import subprocess
import sys
import time
import urllib.request

import pytest
from harness_helpers import write_inventory

from dtlab.errors import DtlabError
from dtlab.platforms import load_cluster, ray
from dtlab.remote import CommandResult
from dtlab.waiting import wait_until

pytestmark = pytest.mark.slow  # a Ray head and a worker raylet start (~20 s)

LOOPBACK_MASTER = """\
    all:
      vars: {ansible_user: root}
      children:
        master:
          hosts:
            n0: {ansible_host: 127.0.0.1}
        workers:
          hosts:
            n1: {ansible_host: 127.0.20.11}
"""


def cluster_for(loopback_ray, tmp_path, token_file):
    site = (f"dtlab_device: cpu\ndtlab_venv_dir: {sys.prefix}\n"
            f"ray_dashboard_port: {loopback_ray.dashboard_port}\nray_auth_token_file: {token_file}\n")
    return load_cluster(write_inventory(tmp_path, LOOPBACK_MASTER, group_vars={"all": site}))


def on_master(cluster, path, method="GET"):
    """What dtlab.platforms.ray.api does over SSH, run here: the same command, the same parsing."""
    done = subprocess.run(["sh", "-c", ray.api_command(cluster, path, method)],
                          capture_output=True, text=True, timeout=60)
    return ray.parse_api(CommandResult("n0", done.returncode, done.stdout, done.stderr), "n0", path)


def test_the_probe_lists_the_alive_workers_with_their_cpu_and_not_the_head(loopback_ray, tmp_path):
    cluster = cluster_for(loopback_ray, tmp_path, loopback_ray.token_path)
    workers = ray.alive_workers_in(on_master(cluster, ray.NODES_PATH))
    assert len(workers) == loopback_ray.workers == 2  # the CPU-less head is not among them
    assert all(w["resources_total"]["CPU"] == 1 and w["state"] == "ALIVE" for w in workers), workers


def test_a_wrong_token_is_forbidden_and_said_in_one_line_without_the_token(loopback_ray, tmp_path):
    wrong = tmp_path / "wrong_token"
    wrong.write_text("not-the-cluster-token-0123456789")
    cluster = cluster_for(loopback_ray, tmp_path, wrong)
    with pytest.raises(DtlabError) as refused:
        on_master(cluster, ray.NODES_PATH)
    message = str(refused.value)
    assert message.startswith("host n0: Ray dashboard /api/v0/nodes?limit=1000: HTTP 403")
    assert "\n" not in message and "not-the-cluster-token" not in message


def test_reset_stops_a_running_job_through_the_jobs_api_and_only_once(loopback_ray, tmp_path):
    cluster = cluster_for(loopback_ray, tmp_path, loopback_ray.token_path)
    token = loopback_ray.token_path.read_text().strip()
    submit = urllib.request.Request(
        f"http://127.0.0.1:{loopback_ray.dashboard_port}/api/jobs/", method="POST",
        data=json.dumps({"entrypoint": "sleep 300"}).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(submit, timeout=30) as answer:
        submission_id = json.load(answer)["submission_id"]

    def status() -> str:
        jobs = {job.get("submission_id"): job for job in on_master(cluster, "/api/jobs/")}
        return jobs[submission_id]["status"]

    wait_until(status, until=lambda s: s == "RUNNING", timeout_s=120, every_s=1, what="the job to run")
    assert ray.stop_jobs(cluster, call=on_master) == [submission_id]
    assert wait_until(status, until=lambda s: s == "STOPPED", timeout_s=60, every_s=1) == "STOPPED"
    assert ray.stop_jobs(cluster, call=on_master) == []  # a stopped job is left alone


def test_waiting_for_workers_returns_once_they_joined_waits_out_missing_ones_and_not_a_silent_head(
    loopback_ray, tmp_path
):
    cluster = cluster_for(loopback_ray, tmp_path, loopback_ray.token_path)
    assert ray.wait_for_workers(cluster, 2, timeout_s=30, call=on_master) == 2  # the two workers: at once
    assert ray.wait_for_workers(cluster, 3, timeout_s=5, call=on_master) == 2  # a third never joins

    silent = load_cluster(write_inventory(tmp_path / "silent", LOOPBACK_MASTER, group_vars={"all": (
        f"dtlab_device: cpu\ndtlab_venv_dir: {sys.prefix}\nray_dashboard_port: 1\n"
        f"ray_auth_token_file: {loopback_ray.token_path}\n")}))  # nothing listens on port 1
    started = time.monotonic()
    assert ray.wait_for_workers(silent, 2, timeout_s=30, call=on_master) == 0
    assert time.monotonic() - started < 15  # no head: no wait
