"""The health gate on the real lab: bench.all refuses nodes that do not answer and writes nothing; the
healthy lab passes `invoke cluster.doctor --json` with its all-reduce matrix filled; a node a cell failed
on that then fails its re-check is drained, and the matrix's later cells that need it are skipped.

Needs root; uses the provisioned session lab with the trainer deployed (tests/harness/conftest.py
`harness_lab`); the first test only its inventory, keys and guard route.
"""

from __future__ import annotations

import json
import time
from itertools import combinations
from pathlib import Path

import pytest
from harness_helpers import invoke, write_inventory

from dtlab import doctor, paths, remote
from dtlab.errors import DtlabError
from dtlab.results import Provenance, ResultStore
from dtlab.waiting import wait_until

pytestmark = [pytest.mark.lab, pytest.mark.slow]

# A /24 inside the lab range that no lab takes (derived lab subnets are x.x.100-249.0, the default .77):
# the host's guard route blackholes it, so every connect fails at once.
NOBODYS_SUBNET = "10.213.3."
GATE_WITHIN_S = 15  # the brief's budget for the gate on the lab; the gate runs before every bench.all
SSHD_DOWN_S = 40  # long enough for the failing cell and the re-check, which take seconds




def tree(directory: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(directory)): None if p.is_dir() else p.read_bytes()
        for p in sorted(directory.rglob("*"))
    }


@pytest.mark.core
def test_bench_all_on_nodes_that_do_not_answer_refuses_with_one_line_per_failure_and_writes_nothing(
    harness_lab, tmp_path
):
    from dtlab.cell import Cell

    cluster, _ = harness_lab
    names = [node.name for node in cluster.nodes]
    # The lab's own inventory, keys and all, with every address moved where no node is.
    text = cluster.inventory_path.read_text()
    lab_prefix = cluster.master.address.rsplit(".", 1)[0] + "."
    moved = text.replace("{{ inventory_dir }}/..", str(paths.REPO_ROOT)).replace(lab_prefix, NOBODYS_SUBNET)
    assert moved.count(f"ansible_host: {NOBODYS_SUBNET}") == len(names)
    inventory = write_inventory(
        tmp_path / "silent", moved, group_vars={"lab": paths.LAB_VARS_FILE.read_text()}
    )
    results = tmp_path / "results"
    store = ResultStore(results / cluster.name)  # a store with one recorded attempt already
    store.record_failure(
        Cell("ddp", 1, 2, 0, "smoke"),
        Provenance(config_hash="0123456789abcdef", git_rev=None, inventory=cluster.name),
        reason="an earlier failure",
        node="node1",
    )
    before = tree(results)

    started = time.monotonic()
    refused = invoke("bench.all", "-i", str(inventory), env={"DTLAB_RESULTS_DIR": str(results)})
    elapsed = time.monotonic() - started

    assert refused.returncode == 1, refused.stdout + refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert lines[0].startswith(
        f"error: health gate: {len(names)} check(s) failed on "
        f"{cluster.name}: the matrix did not start, nothing was reserved or written"
    )
    assert lines[1:] == [line for line in lines[1:] if line.startswith("error: health gate: node")]
    assert [line.split(": ")[2:4] for line in lines[1:]] == [[node, "ssh"] for node in names]
    assert all(f"({NOBODYS_SUBNET}" in line and "ssh failed" in line for line in lines[1:])
    assert "Traceback" not in refused.stdout + refused.stderr
    assert tree(results) == before, "no attempt reserved, the store unchanged, no gate file"
    assert elapsed < 60, f"the refusal took {elapsed:.0f} s"


def test_the_healthy_lab_passes_the_gate_with_parseable_json_and_its_all_reduce_matrix_filled(harness_lab):
    cluster, env = harness_lab
    answer = invoke("cluster.doctor", "-i", str(cluster.inventory_path), "--json", env=env)
    assert answer.returncode == 0, answer.stdout[-3000:] + answer.stderr
    document = json.loads(answer.stdout)
    assert document["status"] == "healthy" and document["failures"] == [], document["failures"]
    assert document["seconds"] < GATE_WITHIN_S, document["seconds"]
    workers = [w.name for w in cluster.workers]
    pairs = {tuple(pair["nodes"]): pair for pair in document["allreduce"]["pairs"]}
    assert set(pairs) == set(combinations(workers, 2)) and document["allreduce"]["backend"] == "gloo"
    for pair in pairs.values():
        assert pair["error"] is None and 0 < pair["latency_ms"] < 50 and pair["bandwidth_mb_s"] > 10, pair
        assert [size["bytes"] for size in pair["by_size"]] == list(doctor.MESSAGE_SIZES)
    by_check = {(c["check"], c["node"]): c for c in document["checks"]}
    for node in cluster.nodes:  # every node's clock offset and free disk, as numbers
        assert by_check[("clock skew", node.name)]["verdict"] == "pass"
        assert abs(by_check[("clock skew", node.name)]["value"]) <= 1.5
        assert by_check[("free disk", node.name)]["value"] >= 2
    # Every platform's services were judged too.
    checks = {c["check"] for c in document["checks"] if c["verdict"] == "pass"}
    assert {
        "spark master",
        "ray head",
        "ray worker",
        "slurm controller",
        "slurm node",
        "postgresql",
        "trainer env",
        "socket interface",
        "all-reduce",
    } <= checks


def _answers(node) -> bool:
    try:
        return remote.run(node, "true", timeout=10).ok
    except DtlabError:
        return False


def test_a_node_that_fails_its_recheck_is_drained_and_the_cells_that_need_it_are_skipped(
    harness_lab, tmp_path
):
    from dtlab.bench import Bench, BenchOptions, Display
    from dtlab.commands import matrix_summary

    cluster, _ = harness_lab
    second = cluster.workers[1]
    matrix_file = tmp_path / "matrix.yml"
    matrix_file.write_text("""\
profiles:
  drain:
    timeout_s: 600
    trainer: {model: "generated:bert-tiny", dataset: generated, generated_train_size: 256,
              generated_test_size: 64, generated_median_words: 40, max_length: 64, batch_size: 16,
              learning_rate: 1.0e-3, warmup_steps: 2}
    runs: [{frameworks: [ddp], gpus: [1, 2], epochs: [1], seeds: [61, 62]}]
""")
    lines: list[str] = []

    class SshdStopsAfterTheFirstCell(Display):
        stopped = False

        def note(self, message: str) -> None:
            lines.append(message)
            super().note(message)

        def finish_cell(self, outcome) -> None:
            super().finish_cell(outcome)
            if not self.stopped:
                self.stopped = True
                # Bounded: a timer on the node starts sshd again after SSHD_DOWN_S. Connections already
                # open survive (ssh.service stops with KillMode=process); new ones are refused.
                back = f"dtlab-test-sshd-back-{int(time.time())}"
                answer = remote.run(
                    second,
                    f"systemd-run --quiet --on-active={SSHD_DOWN_S} --unit={back} "
                    "systemctl start ssh.service && systemctl stop ssh.service",
                )
                assert answer.ok, answer

    store = ResultStore(tmp_path / "results")  # its own: these tiny cells stay out of the session's store
    bench = Bench(
        cluster,
        BenchOptions(profile="drain", matrix_path=matrix_file),
        store=store,
        display=SshdStopsAfterTheFirstCell(4, verbose=False),
    )
    try:
        outcomes = bench.run_matrix(bench.load_matrix())
    finally:
        assert wait_until(lambda: _answers(second), timeout_s=SSHD_DOWN_S + 60, every_s=2), (
            "sshd never came back"
        )

    assert [(o.cell.key, o.status) for o in outcomes] == [
        ("ddp-g1-e1-s61", "ok"),
        ("ddp-g2-e1-s61", "failed"),
        ("ddp-g1-e1-s62", "ok"),
        ("ddp-g2-e1-s62", "skipped"),
    ], [(o.cell.key, o.status, o.failure and o.failure.reason) for o in outcomes]
    failed, skipped = outcomes[1], outcomes[3]
    assert failed.failure.node == second.name and failed.failure.reason.startswith("preflight: ")
    assert list(bench.drained) == [second.name] and bench.drained[second.name].startswith("ssh: host ")
    assert skipped.skipped_because == f"{second.name} drained ({bench.drained[second.name]})"
    assert f"· ddp-g2-e1-s62: skipped: {second.name} drained (ssh: " in "\n".join(lines)
    assert not store.runs(status=None, cell_key="ddp-g2-e1-s62"), "a skipped cell is not a failure"
    assert [run.cell_key for run in store.runs(status="failed")] == ["ddp-g2-e1-s61"]
    summary = matrix_summary("bench.all", "drain", outcomes, bench.drained)
    assert (
        summary[0]
        == f"bench.all drain: 2 ran ok, 0 already recorded, 1 failed, 1 skipped ({second.name} drained)"
    )
    assert summary[1].startswith(f"drained: {second.name} (ssh: ") and summary[1].endswith(
        "skipped: ddp-g2-e1-s62"
    )
    # Beside the results: the gate that passed before the matrix, and the re-check that drained the node.
    assert bench.gate.path.parent == store.root / paths.GATE_DIRNAME
    gate = json.loads(bench.gate.path.read_text())
    assert gate["status"] == "healthy" and gate["matrix"]["profile"] == "drain"
    [recheck] = gate["rechecks"]
    assert (recheck["scope"], recheck["after_cell"], recheck["drained"]) == (
        second.name,
        "ddp-g2-e1-s61",
        True,
    )
    assert recheck["failures"][0].startswith(f"{second.name}: ssh: ")
