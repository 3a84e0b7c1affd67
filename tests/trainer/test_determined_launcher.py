"""The Determined launcher (Core API) for real, off-cluster: no master here, so core.init() hands out
Determined's own dummy contexts. 2 CPU workers under torchrun are preempted after epoch 1 (the test
hook), checkpoint through the Core API, exit 0, and a second run resumes and completes."""

import http.server
import json
import subprocess
import sys
import threading

import pytest
from determined import core
from determined.common import api

from tests.trainer.conftest import free_loopback_port, run, trainer_env, write_config
from trainer.launchers.determined import OFF_CLUSTER_LABEL, PREEMPT_ENV, DeterminedHooks
from trainer.result import validate_result

SMALL = dict(generated_train_size=64, generated_test_size=32)  # the launcher is under test, not learning


def determined_command(nproc: int, *trainer_args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc_per_node={nproc}",
            "--master_addr=127.0.0.1", f"--master_port={free_loopback_port()}",
            "-m", "trainer.launchers.determined", *trainer_args]


@pytest.fixture
def core_api_ports(monkeypatch):
    """Determined's chief-worker messaging ports (default 12360+): free ones, so parallel runs don't clash."""
    monkeypatch.setenv("INTER_TRAIN_PROCESS_COMM_PORT_1", str(free_loopback_port()))
    monkeypatch.setenv("INTER_TRAIN_PROCESS_COMM_PORT_2", str(free_loopback_port()))


@pytest.mark.slow  # over 10 s on 2 cores: not in `invoke test --fast`
def test_preempted_run_checkpoints_exits_cleanly_and_resumes(make_config, tmp_path, core_api_ports):
    checkpoints = tmp_path / "checkpoints"
    cfg = make_config(epochs=2, checkpoint_dir=str(checkpoints), **SMALL)
    config_file = write_config(cfg, tmp_path / "run.yml")

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(PREEMPT_ENV, "1")  # the launcher's test hook: Determined "preempts" after epoch 1
        preempted = run(determined_command(2, "--config", str(config_file)))  # rc 0
    assert "stopping after epoch 1" in preempted.stdout
    assert not (tmp_path / "out" / "result.json").exists()
    stored = [json.loads(meta.read_text()) for meta in checkpoints.glob("*/metadata.json")]
    assert [(meta["epoch"], meta["steps_completed"]) for meta in stored] == [(1, 1)]

    resumed = run(determined_command(2, "--config", str(config_file)))
    assert "resuming from" in resumed.stdout
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    validate_result(result)
    assert (result["framework"], result["framework_label"]) == ("determined", OFF_CLUSTER_LABEL)
    assert (result["world_size"], result["resumed_from_epoch"]) == (2, 1)
    assert [m["epoch"] for m in result["epoch_metrics"]] == [1, 2]
    assert len(list(checkpoints.glob("*/metadata.json"))) == 2


@pytest.mark.slow
def test_label_cannot_claim_a_cluster_run(make_config, tmp_path, core_api_ports):
    """A plain process (no torchrun) off-cluster, even when the config asks for another label."""
    cfg = make_config(epochs=1, framework_label="determined (cluster)", **SMALL)
    config_file = write_config(cfg, tmp_path / "run.yml")
    run([sys.executable, "-m", "trainer.launchers.determined", "--config", str(config_file)])
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert (result["framework_label"], result["world_size"]) == (OFF_CLUSTER_LABEL, 1)


@pytest.fixture
def metrics_master():
    """A loopback HTTP endpoint in the master's place: it records what Determined's own client posts
    (Determined's REST API: the requests a real master would receive) and answers 200."""
    received: list[tuple[str, dict]] = []

    class Master(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.path, json.loads(body)))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):  # keep the test's output clean
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Master)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", received
    server.shutdown()


def test_metrics_go_to_the_master_through_the_core_api(tmp_path, metrics_master):
    """Each epoch's train and validation metrics reach the master as Determined's client sends them."""
    url, received = metrics_master
    trial_id = 7
    session = api.Session(url, "determined", "token", None)
    shipper = core._MetricsContext(session, trial_id=trial_id, run_id=1)  # what core.init builds on a cluster
    train = core.TrainContext(session, trial_id, 1, shipper, core.DummyDistributedContext(),
                              core.TensorboardMode.MANUAL, None, None)
    with core.init(checkpoint_storage=str(tmp_path)) as off_cluster:
        context = core.Context(checkpoint=off_cluster.checkpoint, train=train, _metrics=shipper)
        with context:  # leaving it waits until every report has been posted
            hooks = DeterminedHooks(context, info=None, local_dir=str(tmp_path), preempt_after_epoch=None)
            hooks.on_epoch_end(1, {"epoch": 1, "train_loss": 0.5, "val_loss": 0.4, "val_accuracy": 0.9})
            assert not hooks.should_stop()
    reports = {body["group"]: body["metrics"] for path, body in received
               if path == f"/api/v1/trials/{trial_id}/metrics"}
    assert reports["training"]["metrics"]["avgMetrics"] == {"train_loss": 0.5}
    # `epochs` too: an adaptive_asha search's time_metric (Determined 0.38 requires the trial to report it).
    validation = {"val_loss": 0.4, "val_accuracy": 0.9, "epochs": 1}
    assert reports["validation"]["metrics"]["avgMetrics"] == validation
    assert [(report["trialId"], report["stepsCompleted"]) for report in reports.values()] == [(7, 1), (7, 1)]


def test_bad_value_fails_with_one_line_before_training(tmp_path):
    command = [sys.executable, "-m", "trainer.launchers.determined", "--epochs", "0",
               "--output-dir", str(tmp_path)]
    failed = subprocess.run(command, env=trainer_env(), capture_output=True, text=True, timeout=120)
    assert failed.returncode == 2
    assert failed.stderr.strip().splitlines() == [
        "python -m trainer.launchers.determined: error: epochs: must be an integer >= 1, got 0"]
