"""The results store: append-only, atomic, resumable, validated (dtlab/results/)."""

import json
import sqlite3
import threading

import pytest
from result_factory import made_up_result, made_up_search

from dtlab.cell import Cell, Fault, config_hash
from dtlab.errors import DtlabError
from dtlab.results import _DDL, _SCHEMA_VERSION, DB_FILENAME, Provenance, ResultStore

HASH = "0123456789abcdef"
OTHER_HASH = "fedcba9876543210"
CELL = Cell("ddp", gpus=2, epochs=3, seed=7, profile="smoke", trainer_config={"max_length": 64})


def result_for(cell: Cell, *, time_total_s: float = 30.0, final_accuracy: float = 0.75, **options) -> dict:
    return made_up_result(
        cell.framework,
        cell.gpus,
        cell.epochs,
        cell.seed,
        time_total_s=time_total_s,
        final_accuracy=final_accuracy,
        **options,
    )


def record_ok(store: ResultStore, cell: Cell = CELL, config_hash: str = HASH, **options):
    return store.record_ok(
        cell,
        result_for(cell, **options),
        Provenance(
            config_hash=config_hash,
            git_rev="abc1234",
            inventory="lab",
            node_versions={"node1": {"torch": "2.13.0"}},
            harness_time_s=35.0,
        ),
    )


def record_failure(store: ResultStore, cell: Cell = CELL, config_hash: str = HASH):
    return store.record_failure(
        cell,
        Provenance(
            config_hash=config_hash,
            git_rev="abc1234",
            inventory="lab",
            node_versions={},
            harness_time_s=12.0,
        ),
        reason="trainer exited 1 on node2",
        node="node2",
        exit_code=1,
        log_tail=[f"line {i}" for i in range(200)],
    )


def test_cell_key_is_stable_and_ignores_trainer_config():
    assert CELL.key == "ddp-g2-e3-s7"
    assert Cell("ddp", 2, 3, 7, "smoke", {"other": 1}) == CELL
    assert hash(Cell("ddp", 2, 3, 7, "smoke")) == hash(CELL)


def test_ok_result_is_recorded_with_everything_and_read_back(tmp_path):
    store = ResultStore(tmp_path)
    logs = tmp_path / "fetched-logs"
    logs.mkdir()
    (logs / "node1.log").write_text("epoch 1 done\n")
    run = store.record_ok(
        CELL,
        result_for(CELL),
        Provenance(
            config_hash=HASH,
            git_rev="abc1234",
            inventory="lab",
            node_versions={"node1": {"torch": "2.13.0", "driver": "535"}},
            log_dir=logs,
            harness_time_s=35.0,
        ),
    )

    [read] = store.runs("ok")
    assert read == run
    assert (read.cell, read.cell.trainer_config) == (CELL, {"max_length": 64})
    assert (read.attempt, read.status, read.config_hash, read.git_rev, read.inventory) == (
        1,
        "ok",
        HASH,
        "abc1234",
        "lab",
    )
    assert read.node_versions == {"node1": {"torch": "2.13.0", "driver": "535"}}
    assert (read.harness_time_s, read.trainer_time_s) == (35.0, 30.0)
    assert read.run_dir == tmp_path / "runs" / "ddp-g2-e3-s7" / "attempt-1"
    assert json.loads((read.run_dir / "result.json").read_text()) == read.result == result_for(CELL)
    assert (read.log_dir / "node1.log").read_text() == "epoch 1 done\n"
    assert (tmp_path / DB_FILENAME).is_file()
    assert not list(tmp_path.rglob("*.tmp")), "temporary files must be renamed into place"
    with sqlite3.connect(tmp_path / DB_FILENAME) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_failure_records_node_exit_code_and_log_tail(tmp_path):
    store = ResultStore(tmp_path)
    record_failure(store)
    [failure] = store.runs("failed")
    assert (failure.failed_node, failure.exit_code) == ("node2", 1)
    assert failure.reason == "trainer exited 1 on node2"
    assert failure.log_tail[-1] == "line 199" and len(failure.log_tail) == 50
    assert failure.result is None
    assert json.loads((failure.run_dir / "failure.json").read_text())["node"] == "node2"
    assert store.runs("ok") == []


def test_failure_after_ok_result_does_not_remove_it(tmp_path):
    store = ResultStore(tmp_path)
    ok = record_ok(store)
    record_failure(store)
    assert store.runs("ok") == [ok]
    assert [(r.attempt, r.status) for r in store.runs(None)] == [(1, "ok"), (2, "failed")]
    assert store.is_done(CELL.key, HASH)
    assert (ok.run_dir / "result.json").is_file()


def test_force_rerun_adds_an_attempt_and_keeps_the_first(tmp_path):
    store = ResultStore(tmp_path)
    first = record_ok(store, time_total_s=30.0)
    second = record_ok(store, time_total_s=31.0)
    assert (first.attempt, second.attempt) == (1, 2)
    assert [r.trainer_time_s for r in store.runs("ok")] == [30.0, 31.0]
    assert store.latest_ok_runs() == [second]
    assert json.loads((first.run_dir / "result.json").read_text())["time_total_s"] == 30.0


def test_recorded_rows_cannot_be_updated_or_deleted(tmp_path):
    store = ResultStore(tmp_path)
    record_ok(store)
    with sqlite3.connect(tmp_path / DB_FILENAME) as conn:
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            conn.execute("UPDATE runs SET status='failed'")
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            conn.execute("DELETE FROM runs")
    assert len(store.runs("ok")) == 1


def test_an_attempt_number_is_never_recorded_twice(tmp_path):
    store = ResultStore(tmp_path)
    record_ok(store)
    with pytest.raises(DtlabError, match="attempt 1 is already recorded"):
        store.record_failure(
            CELL,
            Provenance(config_hash=HASH, git_rev=None, inventory="lab", attempt=1),
            reason="late duplicate",
        )
    assert [r.status for r in store.runs(None)] == ["ok"]


def test_reserved_attempt_takes_live_logs_in_place(tmp_path):
    store = ResultStore(tmp_path)
    attempt = store.reserve_attempt(CELL)
    assert attempt.number == 1 and attempt.log_dir.is_dir()
    (attempt.log_dir / "node1.log").write_text("streamed live\n")
    assert store.reserve_attempt(CELL).number == 2, "a reserved folder is never handed out twice"
    run = store.record_ok(
        CELL,
        result_for(CELL),
        Provenance(
            config_hash=HASH,
            git_rev=None,
            inventory="lab",
            log_dir=attempt.log_dir,
            attempt=attempt.number,
        ),
    )
    assert (run.log_dir / "node1.log").read_text() == "streamed live\n"
    assert record_ok(store).attempt == 3


def test_is_done_needs_an_ok_attempt_with_the_same_config_hash(tmp_path):
    store = ResultStore(tmp_path / "not-yet")
    assert not store.is_done(CELL.key, HASH)
    assert not (tmp_path / "not-yet").exists(), "reading must not create the store"
    record_failure(store)
    assert not store.is_done(CELL.key, HASH)
    record_ok(store, config_hash=OTHER_HASH)
    assert not store.is_done(CELL.key, HASH)
    assert store.is_done(CELL, OTHER_HASH)
    record_ok(store)
    assert store.is_done(CELL.key, HASH)
    assert not store.is_done(Cell("ddp", 1, 3, 7).key, HASH)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda r: r.pop("final_accuracy"), "'final_accuracy' is a required property"),
        (lambda r: r.update(final_accuracy=1.5), "final_accuracy: 1.5 is greater than the maximum of 1"),
        (lambda r: r.update(framework="MPI"), "framework: 'MPI' does not match"),
        (lambda r: r["epoch_metrics"][0].pop("val_accuracy"), "epoch_metrics/0"),
    ],
)
def test_invalid_result_is_rejected_and_nothing_recorded(tmp_path, damage, message):
    store = ResultStore(tmp_path)
    result = result_for(CELL)
    damage(result)
    with pytest.raises(DtlabError, match=message):
        store.record_ok(CELL, result, Provenance(config_hash=HASH, git_rev=None, inventory="lab"))
    assert store.runs(None) == []
    assert not list(tmp_path.rglob("result.json"))


def test_result_of_another_cell_is_rejected(tmp_path):
    store = ResultStore(tmp_path)
    with pytest.raises(DtlabError, match="seed is 8 but the cell has 7"):
        store.record_ok(
            CELL,
            result_for(Cell("ddp", 2, 3, 8)),
            Provenance(config_hash=HASH, git_rev=None, inventory="lab"),
        )


def test_concurrent_writers_get_distinct_attempts(tmp_path):
    store = ResultStore(tmp_path)
    errors = []

    def writer():
        try:
            for _ in range(3):
                record_ok(store)
        except Exception as error:  # surfaced below
            errors.append(error)

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    assert sorted(r.attempt for r in store.runs("ok")) == list(range(1, 13))


def test_delete_all_needs_explicit_confirmation(tmp_path):
    store = ResultStore(tmp_path)
    record_ok(store)
    with pytest.raises(DtlabError, match="confirm=True"):
        store.delete_all()
    assert store.is_done(CELL.key, HASH)
    store.delete_all(confirm=True)
    assert store.runs(None) == [] and not store.runs_dir.exists()




def test_a_faulted_cell_is_its_own_cell_and_keeps_what_its_fault_plan_did(tmp_path):
    store = ResultStore(tmp_path / "store")
    faulted = Cell("ddp", 2, 3, 7, "faults", {"max_length": 64}, fault="kill-after1")
    assert faulted.key == "ddp-g2-e3-s7-kill-after1" and faulted.undisturbed.key == "ddp-g2-e3-s7"
    assert faulted != faulted.undisturbed and config_hash(faulted) != config_hash(faulted.undisturbed)
    assert config_hash(CELL) == config_hash(Cell("ddp", 2, 3, 7, "x", {"max_length": 64}))  # unchanged
    store.record_ok(
        faulted,
        result_for(faulted),
        Provenance(
            config_hash=config_hash(faulted),
            git_rev=None,
            inventory="lab",
            fault_record={"injected_unix": 1.5, "node": "node2"},
        ),
    )
    [run] = store.runs("ok")
    assert run.cell.fault == "kill-after1" and run.cell.fault_plan.kind == "kill"
    assert run.fault_record == {"injected_unix": 1.5, "node": "node2"}
    assert store.is_done(faulted, config_hash(faulted)) and not store.is_done(CELL, config_hash(CELL))


@pytest.mark.parametrize("spec", ["kill", "crash-after1", "kill-after", "netdrop-afterx-20s"])
def test_a_malformed_fault_spec_is_one_line(spec):
    with pytest.raises(DtlabError, match=f"fault {spec!r}: expected KIND-afterK"):
        Fault.parse(spec)


def test_a_version_1_store_is_read_as_is_and_upgraded_by_its_next_write_with_every_run_kept(tmp_path):
    # A store as dtlab wrote it before fault plans: version 1, without the two fault columns.
    old = ResultStore(tmp_path / "old")
    old.root.mkdir(parents=True)
    v1_ddl = "\n".join(line for line in _DDL[0].splitlines()
                       if not line.lstrip().startswith(("fault", "strategy", "model", "data_path", "task")))
    with sqlite3.connect(old.db_path) as conn:
        conn.execute(v1_ddl)
        assert "fault" not in [row[1] for row in conn.execute("PRAGMA table_info(runs)")]
        conn.execute("INSERT INTO runs (cell_key, attempt, framework, gpus, epochs, seed, profile, "
                     "trainer_config, config_hash, node_versions, status, reason, run_dir, recorded_at) "
                     "VALUES "
                     "('ddp-g2-e3-s7', 1, 'ddp', 2, 3, 7, 'smoke', '{}', ?, '{}', 'failed', 'boom', "
                     "'runs/ddp-g2-e3-s7/attempt-1', '2026-01-01T00:00:00Z')", (HASH,))
        conn.execute("PRAGMA user_version=1")
    old.check(writable=False)
    [read] = old.runs(status=None)
    assert read.cell.fault == "" and read.fault_record is None and read.reason == "boom"
    assert read.cell.strategy == "ddp"
    record_ok(old)  # the first write adds the columns; the old run stays, unchanged
    runs = old.runs(status=None)
    assert [(r.attempt, r.status, r.reason) for r in runs] == [(1, "failed", "boom"), (2, "ok", None)]
    assert [r.cell.strategy for r in runs] == ["ddp", "ddp"]
    with sqlite3.connect(old.db_path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == _SCHEMA_VERSION == 6


def _version_2_store(root) -> ResultStore:
    """A store as dtlab wrote it before strategies: version 2, one faulted ok run, no strategy column."""
    old = ResultStore(root)
    old.root.mkdir(parents=True)
    v2_ddl = "\n".join(line for line in _DDL[0].splitlines()
                        if not line.lstrip().startswith(("strategy", "model", "data_path", "task")))
    faulted = Cell("ray", 2, 3, 7, "faults", {"max_length": 64}, fault="kill-after1")
    result = result_for(faulted)
    with sqlite3.connect(old.db_path) as conn:
        conn.execute(v2_ddl)
        conn.execute("INSERT INTO runs (cell_key, attempt, framework, gpus, epochs, seed, profile, "
                     "trainer_config, config_hash, node_versions, status, run_dir, recorded_at, result_json, "
                     "fault, fault_record) VALUES (?, 1, 'ray', 2, 3, 7, 'faults', "
                     "'{\"max_length\": 64}', ?, '{}', 'ok', ?, '2026-01-01T00:00:00Z', ?, 'kill-after1', "
                     "'{\"node\": \"node2\"}')",
                     (faulted.key, HASH, f"runs/{faulted.key}/attempt-1", json.dumps(result)))
        conn.execute("PRAGMA user_version=2")
    return old


def test_a_version_2_store_reads_as_ddp_and_its_next_write_adds_the_strategy_keeping_every_run(tmp_path):
    old = _version_2_store(tmp_path / "v2")
    before = old.db_path.read_bytes()
    old.check(writable=True)
    assert old.db_path.read_bytes() == before  # checking never changes the file
    [read] = old.runs("ok")
    assert read.cell.strategy == "ddp" and read.cell.key == "ray-g2-e3-s7-kill-after1"
    assert read.fault_record == {"node": "node2"} and read.result["final_accuracy"] == 0.75
    assert old.is_done(read.cell, HASH)  # its key and hash still name it: bench.all skips it
    zero1 = Cell("ray", 2, 3, 7, "faults", {"max_length": 64}, fault="kill-after1", strategy="zero1")
    result = result_for(zero1)
    result["hyperparameters"]["strategy"] = "zero1"
    old.record_ok(zero1, result, Provenance(config_hash=config_hash(zero1), git_rev=None, inventory="lab"))
    runs = old.runs("ok")
    assert [(r.cell.key, r.cell.strategy, r.attempt) for r in runs] == [
        ("ray-g2-e3-s7-kill-after1", "ddp", 1), ("ray-g2-e3-s7-zero1-kill-after1", "zero1", 1)]
    assert runs[0] == read  # the old run, read back unchanged
    with sqlite3.connect(old.db_path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == _SCHEMA_VERSION
        assert conn.execute("SELECT strategy FROM runs ORDER BY id").fetchall() == [("ddp",), ("zero1",)]


def test_a_version_3_store_reads_as_its_profiles_model_and_its_next_write_adds_the_model(tmp_path):
    """Before the models axis (version 3): every run trained its profile's model; the first write adds
    the column, and a cell of another model is its own key, hash and row."""
    old = ResultStore(tmp_path / "v3")
    old.root.mkdir(parents=True)
    v3_ddl = "\n".join(line for line in _DDL[0].splitlines()
                       if not line.lstrip().startswith(("model", "data_path", "task")))
    with sqlite3.connect(old.db_path) as conn:
        conn.execute(v3_ddl)
        conn.execute("INSERT INTO runs (cell_key, attempt, framework, gpus, epochs, seed, profile, "
                     "trainer_config, config_hash, node_versions, status, reason, run_dir, recorded_at, "
                     "strategy) VALUES ('ddp-g2-e3-s7-fsdp', 1, 'ddp', 2, 3, 7, 'smoke', '{}', ?, '{}', "
                     "'failed', 'boom', 'runs/ddp-g2-e3-s7-fsdp/attempt-1', '2026-01-01T00:00:00Z', 'fsdp')",
                     (HASH,))
        conn.execute("PRAGMA user_version=3")
    [read] = old.runs(status=None)
    assert (read.cell.model, read.cell.strategy, read.cell.key) == ("", "fsdp", "ddp-g2-e3-s7-fsdp")
    mini = Cell("ddp", 2, 3, 7, "smoke", {"max_length": 64, "model": "generated:bert-mini"}, strategy="fsdp",
                model="generated:bert-mini")
    result = result_for(mini)
    result["hyperparameters"] |= {"strategy": "fsdp", "model": "generated:bert-mini"}
    old.record_ok(mini, result, Provenance(config_hash=config_hash(mini), git_rev=None, inventory="lab"))
    runs = old.runs(status=None)
    assert [(r.cell.key, r.cell.model) for r in runs] == [
        ("ddp-g2-e3-s7-fsdp", ""), ("ddp-g2-e3-s7-fsdp-bert-mini", "generated:bert-mini")]
    assert runs[0] == read
    with sqlite3.connect(old.db_path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == _SCHEMA_VERSION == 6
        models = conn.execute("SELECT model FROM runs ORDER BY id").fetchall()
        assert models == [("",), ("generated:bert-mini",)]


def test_a_version_4_store_reads_as_the_loaders_and_its_next_write_adds_the_data_path(tmp_path):
    """Before the data paths (version 4): every run read its tokens through the DataLoader; the first write
    adds the column, and a platform-ETL cell is its own key, hash and row."""
    old = ResultStore(tmp_path / "v4")
    old.root.mkdir(parents=True)
    v4_ddl = "\n".join(line for line in _DDL[0].splitlines()
                       if not line.lstrip().startswith(("data_path", "task")))
    with sqlite3.connect(old.db_path) as conn:
        conn.execute(v4_ddl)
        conn.execute("INSERT INTO runs (cell_key, attempt, framework, gpus, epochs, seed, profile, "
                     "trainer_config, config_hash, node_versions, status, reason, run_dir, recorded_at) "
                     "VALUES ('spark-g2-e3-s7', 1, 'spark', 2, 3, 7, 'smoke', '{}', ?, '{}', 'failed', "
                     "'boom', 'runs/spark-g2-e3-s7/attempt-1', '2026-01-01T00:00:00Z')", (HASH,))
        conn.execute("PRAGMA user_version=4")
    [read] = old.runs(status=None)
    assert (read.cell.data_path, read.cell.key) == ("loader", "spark-g2-e3-s7")
    etl = Cell("spark", 2, 3, 7, "smoke", {"max_length": 64}, data_path="platform")
    assert etl.key == "spark-g2-e3-s7-etl" and config_hash(etl) != config_hash(read.cell)
    result = result_for(etl)
    with pytest.raises(DtlabError, match="data_path is 'loader' but the cell has 'platform'"):
        old.record_ok(etl, result, Provenance(config_hash=config_hash(etl), git_rev=None, inventory="lab"))
    result["config"] = {**result.get("config", {}), "data_path": "platform"}
    old.record_ok(etl, result, Provenance(config_hash=config_hash(etl), git_rev=None, inventory="lab"))
    runs = old.runs(status=None)
    assert [(r.cell.key, r.cell.data_path) for r in runs] == [
        ("spark-g2-e3-s7", "loader"), ("spark-g2-e3-s7-etl", "platform")]
    assert runs[0] == read
    with sqlite3.connect(old.db_path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == _SCHEMA_VERSION == 6


def test_a_model_is_its_own_cell_key_and_hash_and_a_result_of_another_model_is_refused(tmp_path):
    store = ResultStore(tmp_path / "store")
    model = "prajjwal1/bert-mini"
    mini = Cell("ddp", 2, 3, 7, "smoke", {"max_length": 64, "model": model}, model=model)
    assert mini.key == "ddp-g2-e3-s7-bert-mini" and mini != CELL and config_hash(mini) != config_hash(CELL)
    assert mini.undisturbed == mini and mini.to_dict()["model"] == "prajjwal1/bert-mini"
    # The model is said once: a cell given it without the same trainer option trains and hashes it still.
    bare = Cell("ddp", 2, 3, 7, "smoke", {"max_length": 64}, model=model)
    assert bare.trainer_config["model"] == model and config_hash(bare) == config_hash(mini)
    assert "model" not in CELL.to_dict()
    result = result_for(mini)
    result["hyperparameters"]["model"] = "prajjwal1/bert-tiny"
    provenance = Provenance(config_hash=config_hash(mini), git_rev=None, inventory="lab")
    with pytest.raises(DtlabError, match="model is 'prajjwal1/bert-tiny' but the cell has 'prajjwal1/"):
        store.record_ok(mini, result, provenance)
    assert not store.exists() or store.runs(status=None) == []


def test_a_strategy_is_its_own_cell_key_and_hash_and_is_stored_per_run(tmp_path):
    store = ResultStore(tmp_path / "store")
    fsdp = Cell("ddp", 2, 3, 7, "smoke", {"max_length": 64}, strategy="fsdp")
    assert CELL.key == "ddp-g2-e3-s7" and fsdp.key == "ddp-g2-e3-s7-fsdp"
    assert fsdp != CELL and config_hash(fsdp) != config_hash(CELL)
    # A ddp cell's hash is what it was before strategies: the strategy is hashed only when set.
    assert config_hash(CELL) == config_hash(Cell("ddp", 2, 3, 7, "x", {"max_length": 64}, strategy="ddp"))
    faulted = Cell("ddp", 2, 3, 7, "faults", {}, fault="kill-after1", strategy="tensor")
    assert faulted.key == "ddp-g2-e3-s7-tensor-kill-after1"
    assert faulted.undisturbed.strategy == "tensor" and faulted.undisturbed.key == "ddp-g2-e3-s7-tensor"
    assert (fsdp.to_dict()["strategy"], faulted.to_dict()["strategy"]) == ("fsdp", "tensor")
    assert "strategy" not in CELL.to_dict()  # a ddp cell's failure.json reads as before
    result = result_for(fsdp)
    result["hyperparameters"]["strategy"] = "fsdp"
    store.record_ok(fsdp, result, Provenance(config_hash=config_hash(fsdp), git_rev=None, inventory="lab"))
    record_failure(store, faulted, config_hash(faulted))
    runs = {run.cell.key: run for run in store.runs(None)}
    assert runs["ddp-g2-e3-s7-fsdp"].cell.strategy == "fsdp"
    assert runs["ddp-g2-e3-s7-tensor-kill-after1"].cell == faulted
    failure = json.loads((runs["ddp-g2-e3-s7-tensor-kill-after1"].run_dir / "failure.json").read_text())
    assert failure["cell"] == faulted.to_dict()
    assert (failure["cell"]["strategy"], failure["cell"]["fault"]) == ("tensor", "kill-after1")
    assert store.is_done(fsdp, config_hash(fsdp)) and not store.is_done(CELL, config_hash(fsdp))


def test_a_result_trained_with_another_strategy_is_refused(tmp_path):
    store = ResultStore(tmp_path)
    zero1 = Cell("ddp", 2, 3, 7, "smoke", {}, strategy="zero1")
    with pytest.raises(DtlabError, match="strategy is 'ddp' but the cell has 'zero1'"):
        store.record_ok(zero1, result_for(zero1), Provenance(config_hash=HASH, git_rev=None, inventory="lab"))
    assert store.runs(None) == []


def test_a_search_cell_records_its_search_json_read_back_with_its_plan_and_refuses_another_cells(tmp_path):
    """A search cell (#54) is its own key and row: its search.json (not a trainer result, no MLPerf log),
    checked against the cell's early stopping, budget and trial count; a version-5 store gains the task."""
    old = ResultStore(tmp_path / "v5")
    old.root.mkdir(parents=True)
    v5_ddl = "\n".join(line for line in _DDL[0].splitlines() if not line.lstrip().startswith("task"))
    with sqlite3.connect(old.db_path) as conn:
        conn.execute(v5_ddl)
        conn.execute("PRAGMA user_version=5")
    plan = {"trials": [{"learning_rate": 0.001}, {"learning_rate": 0.0001}], "budget_epochs": 2,
            "grace_epochs": 1, "reduction_factor": 2, "early_stopping": "asha"}
    cell = Cell("ddp", 2, 2, 1, "tune", {"max_length": 64}, task="search-asha", task_plan=plan)
    provenance = Provenance(config_hash=config_hash(cell), git_rev=None, inventory="lab")
    for wrong, message in (({"early_stopping": "none"}, "early_stopping is 'none' but the cell has 'asha'"),
                           ({"budget_epochs": 3}, "budget_epochs is 3 but the cell has 2"),
                           ({"busy_fraction": "x"}, "busy_fraction: expected float, got 'x'")):
        with pytest.raises(DtlabError, match=message):
            old.record_ok(cell, made_up_search(cell, **wrong), provenance)
    assert old.runs(status=None) == []  # nothing written by a refused record
    run = old.record_ok(cell, made_up_search(cell), provenance)
    [read] = old.runs(status="ok")
    assert read.cell.key == "ddp-g2-e2-s1-search-asha" and read.cell.task_plan == plan
    assert read.result["best"]["number"] == 1 and read.trainer_time_s == 2.0 and read == run
    assert sorted(path.name for path in read.run_dir.iterdir()) == ["logs", "search.json"]
    with sqlite3.connect(old.db_path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == _SCHEMA_VERSION == 6
