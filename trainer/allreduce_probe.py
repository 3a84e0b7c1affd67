"""The health gate's all-reduce probe: how fast two nodes all-reduce with the trainer's own backend.

dtlab.doctor starts one of these on each node of a pair at once, over SSH, with the trainer's venv and
code and the node's GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME (dtlab_socket_env_file):

    python -m trainer.allreduce_probe --rank 0 --world-size 2 --master-addr 10.0.0.11 \\
        --master-port 29510 --device cpu --sizes 8,65536,16777216 --iterations 5 --timeout 20

Each rank prints one JSON line: per message size, the median seconds of one all_reduce of float32s and
its algorithm bandwidth as the NCCL tests define it (algbw = bytes / seconds; their bus bandwidth of an
all-reduce is algbw * 2(n-1)/n, the same for two ranks). Latency is the smallest size's time. A final
all_reduce checks the sum. gloo on cpu, NCCL on cuda (the first visible GPU), as the trainer picks.
Exit 0 measured; 2 bad flags; 3 the group did not form, a collective failed or the sum was wrong.
Standard library and torch only: the trainer's venv runs it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import timedelta

FLOAT32_BYTES = 4


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.allreduce_probe",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--master-addr", required=True, help="rank 0's address (its TCP store listens)")
    parser.add_argument("--master-port", type=int, required=True)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--sizes",
        default="8,65536,16777216",
        help="message sizes in bytes, comma-separated, each a multiple of 4",
    )
    parser.add_argument("--iterations", type=int, default=5, help="timed all_reduces per size")
    parser.add_argument("--warmup", type=int, default=2, help="untimed all_reduces per size first")
    parser.add_argument(
        "--timeout", type=float, default=20.0, help="seconds for the group to form and for each collective"
    )
    args = parser.parse_args(argv)
    try:
        args.sizes = [int(size) for size in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes {args.sizes!r}: comma-separated whole numbers of bytes")
    if any(size < FLOAT32_BYTES or size % FLOAT32_BYTES for size in args.sizes):
        parser.error(f"--sizes: each size must be a positive multiple of {FLOAT32_BYTES} bytes")
    if not 0 <= args.rank < args.world_size or args.iterations < 1 or args.warmup < 0 or args.timeout <= 0:
        parser.error("--rank must be below --world-size; --iterations >= 1, --warmup >= 0, --timeout > 0")
    return args


def measure(args: argparse.Namespace) -> dict:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    backend = "nccl" if args.device == "cuda" else "gloo"
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    dist.init_process_group(
        backend,
        init_method=f"tcp://{args.master_addr}:{args.master_port}",
        rank=args.rank,
        world_size=args.world_size,
        timeout=timedelta(seconds=args.timeout),
        device_id=device if device.type == "cuda" else None,
    )
    try:
        by_size = []
        for size in args.sizes:
            tensor = torch.ones(size // FLOAT32_BYTES, dtype=torch.float32, device=device)
            for _ in range(args.warmup):
                dist.all_reduce(tensor)
            synchronize()
            seconds = []
            for _ in range(args.iterations):
                tensor.fill_(1.0)  # sums stay small: no overflow whatever the iterations
                synchronize()
                started = time.perf_counter()
                dist.all_reduce(tensor)
                synchronize()
                seconds.append(time.perf_counter() - started)
            median = statistics.median(seconds)
            by_size.append(
                {
                    "bytes": size,
                    "seconds": median,
                    "min_seconds": min(seconds),
                    "algbw_bytes_per_s": size / median,
                }
            )
        # The sum of every rank's rank + 1: a wrong sum is a broken transport, however fast.
        check = torch.full((2,), float(args.rank + 1), dtype=torch.float32, device=device)
        dist.all_reduce(check)
        expected = args.world_size * (args.world_size + 1) / 2
        if check.cpu().tolist() != [expected, expected]:
            raise RuntimeError(f"all_reduce summed to {check.cpu().tolist()}, expected {expected}")
    finally:
        dist.destroy_process_group()
    return {
        "rank": args.rank,
        "world_size": args.world_size,
        "backend": backend,
        "device": str(device),
        "torch": torch.__version__,
        "by_size": by_size,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        report = measure(args)
    except Exception as error:  # torch raises many types; the gate needs one line
        lines = str(error).strip().splitlines()
        first = lines[0][:300] if lines else ""
        print(json.dumps({"rank": args.rank, "error": f"{type(error).__name__}: {first}"}))
        return 3
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
