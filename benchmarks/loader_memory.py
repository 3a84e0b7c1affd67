"""The DataLoader path's peak memory while it tokenizes, side by side (issue #53: one tokenizer call over a
whole split at 10x IMDB's size thrashed the lab's host): trainer.data encoding ENCODE_CHUNK reviews a call,
against one call a split, each run in a fresh child process whose peak RSS the kernel reports (wait4),
min/median/max over rounds.

    .venv/bin/python benchmarks/loader_memory.py [--size 50000] [--rounds 3]

A size is the train split's generated IMDB-length reviews, with a test split of a tenth; both are tokenized
to max_length 64 with token_cache false, as the pipeline profile's DataLoader path does (data_paths.py's
train_config). The two take turns, the first one alternating by round. Each child prints a digest of its
tokens (ids, offsets, labels of both splits), and every run's must be the same.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks._trainer_common import machine, spread  # noqa: E402
from benchmarks.data_paths import train_config  # noqa: E402

ONE_CALL = 0  # --chunk 0: the whole split in one tokenizer call


def child(chunk: int, size: int) -> None:
    """Tokenize as the DataLoader path does, with `chunk` reviews a tokenizer call; print a digest of the
    tokens and the seconds it took."""
    import hashlib

    from trainer import data

    with tempfile.TemporaryDirectory(prefix="loader-memory-") as scratch:
        cfg = train_config(size, Path(scratch))
        data.ENCODE_CHUNK = chunk or size  # the one setting the two runs differ in
        started = time.perf_counter()
        splits = data.tokenized_splits(cfg, log=lambda _: None)
        seconds = time.perf_counter() - started
        digest = hashlib.sha256()
        for split in data.SPLITS:
            for array in (splits[split].ids, splits[split].offsets, splits[split].labels):
                digest.update(array.tobytes())
        print(digest.hexdigest()[:16], f"{seconds:.2f}")


def measure(chunk: int, size: int) -> tuple[float, float, str]:
    """(peak RSS in GiB, seconds, the tokens' digest) of one child run."""
    process = subprocess.Popen([sys.executable, __file__, "--child", str(chunk), "--size", str(size)],
                               stdout=subprocess.PIPE, text=True)
    out = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"the child with --chunk {chunk} failed (exit {process.returncode})")
    digest, seconds = out.split()
    return usage.ru_maxrss / 2**20, float(seconds), digest  # ru_maxrss is in KiB on Linux


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=50_000, help="train reviews (a tenth of it more: test)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.size)
        return 0
    from trainer.data import ENCODE_CHUNK

    runs = {"chunked": ENCODE_CHUNK, "one call": ONE_CALL}
    print(f"loader_memory: {args.size:,} + {args.size // 10:,} reviews, {args.rounds} rounds; {machine()}")
    results: dict[str, list[tuple[float, float, str]]] = {name: [] for name in runs}
    for round_number in range(args.rounds):
        order = list(runs) if round_number % 2 == 0 else list(reversed(runs))
        for name in order:
            results[name].append(measure(runs[name], args.size))
            peak, seconds, _ = results[name][-1]
            print(f"  round {round_number + 1} {name:9s} peak {peak:5.2f} GiB in {seconds:6.2f} s")
    if len({digest for runs_of in results.values() for _, _, digest in runs_of}) != 1:
        raise SystemExit("the two ways gave different tokens")
    for name, chunk in runs.items():
        label = f"{name} ({chunk} a call)" if chunk else name
        print(f"{label:22s} peak {spread([r[0] for r in results[name]], unit=' GiB', width=6)}, "
              f"time {spread([r[1] for r in results[name]], unit=' s', width=6)}")
    ratios = [c[0] / o[0] for c, o in zip(results["chunked"], results["one call"], strict=True)]
    print(f"peak chunked / one call: {spread(ratios, unit=' x', width=6)} over {args.rounds} rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
