"""Model and data sources other than generated: a local model directory, staged datasets, offline hubs."""

import subprocess
import sys

import pytest

from tests.trainer.conftest import stage_model_directory, trainer_env
from trainer.core import train
from trainer.data import generate_imdb_like, load_tokenizer
from trainer.model import build_model


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    """A model directory and an IMDB-shaped dataset staged on disk, as on an air-gapped node."""
    from trainer.config import TrainConfig

    root = tmp_path_factory.mktemp("staged")
    generated = TrainConfig(model="generated:bert-tiny", dataset="generated", generated_train_size=128,
                            generated_test_size=64, generated_median_words=40, max_length=64,
                            output_dir=str(root / "out"), cache_dir=str(root / "cache"))
    stage_model_directory(build_model(generated), load_tokenizer(generated), root / "model")
    imdb = generate_imdb_like(seed=3, train_size=128, test_size=64, median_words=40)
    imdb.save_to_disk(root / "saved-imdb")
    for split in ("train", "test"):  # the hub repository's own layout, downloaded
        (root / "imdb-repo" / "plain_text").mkdir(parents=True, exist_ok=True)
        imdb[split].to_parquet(root / "imdb-repo" / "plain_text" / f"{split}-00000-of-00001.parquet")
    return root


@pytest.mark.parametrize("dataset", ["saved-imdb", "imdb-repo"])
def test_local_model_directory_and_staged_dataset(make_config, staged, dataset):
    cfg = make_config(model=str(staged / "model"), dataset=str(staged / dataset), epochs=1)
    result = train(cfg)
    assert result["hyperparameters"]["model"] == str(staged / "model")
    assert result["epoch_metrics"][0]["train_samples"] == 128
    # Validation ran over the staged test split: 64 reviews, so the accuracy is a whole count of them.
    accuracy = result["epoch_metrics"][0]["val_accuracy"]
    assert 0 < accuracy <= 1 and (accuracy * 64) == pytest.approx(round(accuracy * 64))


@pytest.mark.slow
@pytest.mark.parametrize(("flags", "message"), [
    (["--model", "prajjwal1/bert-tiny", "--dataset", "generated"],
     "trainer: error: model: cannot load the tokenizer of prajjwal1/bert-tiny"),
    (["--model", "generated:bert-tiny", "--dataset", "stanfordnlp/imdb"],
     "trainer: error: dataset: cannot load stanfordnlp/imdb"),
])
@pytest.mark.core
def test_hub_sources_offline_fail_with_one_line(tmp_path, flags, message):
    completed = subprocess.run(
        [sys.executable, "-m", "trainer.launchers.torchrun", *flags, "--output-dir", str(tmp_path / "out"),
         "--cache-dir", str(tmp_path / "cache")],
        env={**trainer_env(), "HF_HOME": str(tmp_path / "hf")},  # offline, and an empty hub cache
        capture_output=True, text=True, timeout=300)
    assert completed.returncode == 2, completed.stderr
    errors = [line for line in completed.stderr.splitlines() if line.startswith("trainer: error:")]
    assert len(errors) == 1 and errors[0].startswith(message), completed.stderr
