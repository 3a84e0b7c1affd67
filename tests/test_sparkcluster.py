"""tests/sparkcluster.py without Spark: its config comes from the spark role, and its start-up wait
rides out a master whose /json/ is not ready yet (refused, dropped, empty body) within its deadline."""

import http.server
import json
import shutil
import threading
import time

import pytest

from tests import sparkcluster
from tests.sparkcluster import SparkStandaloneCluster


def test_the_daemons_config_is_the_spark_roles_with_kill_links_off():
    assert sparkcluster.role_defaults()["spark_ui_kill_enabled"] is False
    cluster = SparkStandaloneCluster(workers=1, auth_secret="s3cret-for-test")
    try:
        lines = cluster.spark_defaults_path.read_text().splitlines()
        settings = dict(line.split(None, 1) for line in lines if line and not line.startswith("#"))
        assert settings["spark.ui.killEnabled"] == "false"
        assert settings["spark.master.rest.enabled"] == "false"
        assert settings["spark.authenticate"] == "true"
        assert settings["spark.authenticate.secret"] == "s3cret-for-test"
        assert settings["spark.master"] == cluster.master_url
        assert cluster.spark_defaults_path.stat().st_mode & 0o077 == 0  # the secret's file: 0600
    finally:
        shutil.rmtree(cluster.scratch)


class FakeMaster(http.server.BaseHTTPRequestHandler):
    """A master UI whose /json/ goes through `answers` in order, then repeats the last one."""

    answers: list[str] = []
    served = 0

    def do_GET(self):  # noqa: N802 (http.server's name)
        answer = type(self).answers[min(type(self).served, len(type(self).answers) - 1)]
        type(self).served += 1
        if answer == "drop":  # the connection closes before any status line
            self.close_connection = True
            return
        body = b"" if answer == "empty" else answer.encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class Running:
    """Stands for a daemon process that has not exited."""

    def poll(self):
        return None


@pytest.fixture
def waiting_cluster():
    """(cluster, answers setter): a 1-worker cluster object whose master UI is FakeMaster."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeMaster)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    cluster = SparkStandaloneCluster(workers=1, startup_timeout_s=3)
    cluster.processes = [Running(), Running()]
    cluster.master_json_url = f"http://127.0.0.1:{server.server_address[1]}/json/"

    def answer(*answers: str) -> None:
        FakeMaster.answers, FakeMaster.served = list(answers), 0

    yield cluster, answer
    server.shutdown()
    server.server_close()
    shutil.rmtree(cluster.scratch)


ALIVE = json.dumps({"workers": [{"state": "ALIVE"}]})


def test_wait_rides_out_a_dropped_connection_and_empty_bodies(waiting_cluster):
    cluster, answer = waiting_cluster
    answer("drop", "empty", "empty", '{"workers": [', ALIVE)
    started = time.monotonic()
    cluster._wait_for_alive_workers()
    assert time.monotonic() - started < 3
    assert FakeMaster.served == 5


def test_wait_names_the_empty_body_when_the_deadline_passes(waiting_cluster):
    cluster, answer = waiting_cluster
    answer("empty")
    started = time.monotonic()
    with pytest.raises(TimeoutError) as raised:
        cluster._wait_for_alive_workers()
    assert 3 <= time.monotonic() - started < 5
    assert str(raised.value) == (f"spark standalone cluster not ready after 3 s ({cluster.master_json_url}):"
                                 " the master's /json/ answered with an empty or partial body"
                                 " (Expecting value: line 1 column 1 (char 0))")


@pytest.mark.slow
def test_wait_names_missing_workers_and_a_refused_connection(waiting_cluster):
    cluster, answer = waiting_cluster
    answer(json.dumps({"workers": [{"state": "DEAD"}]}))
    with pytest.raises(TimeoutError, match=r"ready after 3 s .*: 0 of 1 workers ALIVE$"):
        cluster._wait_for_alive_workers()
    cluster.master_json_url = f"http://127.0.0.1:{sparkcluster.free_port()}/json/"  # nothing listens
    with pytest.raises(TimeoutError, match=r"/json/ did not answer \(URLError: .*Connection refused"):
        cluster._wait_for_alive_workers()
