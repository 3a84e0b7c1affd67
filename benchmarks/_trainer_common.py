"""Shared bits of the benchmarks: the machine's description, how a figure over rounds is printed, and
the trainer benchmarks' data config."""

from __future__ import annotations

import os
import platform
import socket
import statistics
import subprocess
import sys
from pathlib import Path

OUT_DIR = Path(__file__).resolve().parent / "out"


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    return f"{os.cpu_count()} CPUs ({model}), load average {load}"


def spread(values: list[float], spec: str = ".2f", unit: str = "", scale: float = 1.0, count: bool = False,
           width: int = 0) -> str:
    """The median, then [min-max], of one figure over rounds: how every benchmark prints a measurement.

    spec formats all three (".1f", ".0f", ".1%"), after scale multiplies them (1000: seconds as ms); unit
    follows the median only: "5.54 s [5.10-6.00]". count appends " n=<rounds>"; width pads the median
    on the left, so that the rows of a table line up. "-" when there is nothing to show.
    """
    if not values:
        return "-"
    low, middle, high = (value * scale for value in (min(values), statistics.median(values), max(values)))
    text = f"{middle:{width or ''}{spec}}{unit} [{low:{spec}}-{high:{spec}}]"
    return f"{text} n={len(values)}" if count else text


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def torchrun(nproc: int, config_file: Path, *extra: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc_per_node={nproc}",
               "--master_addr=127.0.0.1", f"--master_port={free_loopback_port()}",
               "-m", "trainer.launchers.torchrun", "--config", str(config_file), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3600)
    if completed.returncode != 0:
        raise SystemExit(f"torchrun failed:\n{completed.stdout[-3000:]}\n{completed.stderr[-3000:]}")
    return completed


def hf_dataset(split, max_length: int | None = None, with_length: bool = False):
    """A tokenized split (trainer.data.TokenizedSplit) as a datasets.Dataset for Hugging Face's Trainer.

    max_length pads every review to it (the text-classification example's padding="max_length");
    None leaves them ragged for DataCollatorWithPadding. with_length adds the `length` column that
    group_by_length reads instead of measuring every review itself.
    """
    import datasets

    rows = [split.ids[start:end].astype("int64").tolist()
            for start, end in zip(split.offsets[:-1], split.offsets[1:], strict=True)]
    if max_length is None:
        columns = {"input_ids": rows, "attention_mask": [[1] * len(r) for r in rows]}
    else:
        columns = {"input_ids": [r + [0] * (max_length - len(r)) for r in rows],
                   "attention_mask": [[1] * len(r) + [0] * (max_length - len(r)) for r in rows]}
    if with_length:
        columns["length"] = [len(r) for r in rows]
    return datasets.Dataset.from_dict({**columns, "labels": split.labels.tolist()})


def hf_tokenizer(cfg):
    """The run's own tokenizer, wrapped as the fast tokenizer the Trainer's collator expects."""
    from transformers import PreTrainedTokenizerFast

    from trainer.data import load_tokenizer

    return PreTrainedTokenizerFast(tokenizer_object=load_tokenizer(cfg), pad_token="[PAD]",
                                   unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]")
