"""Slurm launcher: `python -m trainer.launchers.slurm --marks F.json -- SBATCH_OPTIONS --wrap "srun ..."`.

The cell's driver on the master; it trains nothing itself. `sbatch --wait` submits the job (its srun
starts one torchrun a node: dtlab.platforms.slurm writes the options), sattach follows the job's step live,
and a driver stopped by SIGTERM or SIGINT (Ctrl-C, timeout, cluster.reset) cancels the job first.
--marks gets the queue's clock: when Slurm took the job and when the job left the queue. The job's end
is read from scontrol every 0.1 s: sbatch --wait's own poll backs off to 10 s and would add that lag.
"""

import argparse
import json
import signal
import subprocess
import sys
import time

from trainer.launchers._slurm import ACTIVE, POLL_S, QUEUED, ask, attach, exit_code, job_fields, poll_while

PROG = "python -m trainer.launchers.slurm"
STEP_WAIT_S = 120  # the job's first step (srun) appears within seconds of the job starting


def follow(job_id: str, sbatch: subprocess.Popen) -> None:
    """Stream step 0's output (every task's) once srun has started it; bounded."""
    deadline, step = time.monotonic() + STEP_WAIT_S, f"{job_id}.0"
    while time.monotonic() < deadline and sbatch.poll() is None:
        if step in ask("squeue", "-h", "-s", "-j", job_id, "-o", "%i").split() and attach(step):
            return
        time.sleep(POLL_S)


def cancel_when_stopped(job_id: str) -> None:
    def cancel(signum, _frame):
        ask("scancel", job_id)  # ends the step's processes on every node (the slurm role's proctrack)
        print(f"slurm: cancelled job {job_id} ({signal.Signals(signum).name})", flush=True)
        sys.exit(128 + signum)

    for stop in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop, cancel)


def main(argv: list[str] | None = None) -> int:  # the job's exit code
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__)
    parser.add_argument("--marks", required=True, help="JSON file for the queue's wall-clock marks")
    parser.add_argument("sbatch_options", nargs=argparse.REMAINDER, help="-- then sbatch's options")
    args = parser.parse_args(argv)
    options = args.sbatch_options[1:] if args.sbatch_options[:1] == ["--"] else args.sbatch_options
    if not options:
        parser.error("no sbatch options after --")
    try:
        sbatch = subprocess.Popen(["sbatch", "--wait", "--parsable", *options], stdout=subprocess.PIPE,
                                  text=True)
    except FileNotFoundError:
        parser.exit(127, f"{PROG}: error: no sbatch here: slurm-client is not installed (the slurm role)\n")
    job_id = sbatch.stdout.readline().strip().split(";")[0]  # --parsable: "ID" or "ID;cluster"
    if not job_id.isdigit():
        return sbatch.wait() or 1  # refused: sbatch said why on stderr
    queued = time.time()
    cancel_when_stopped(job_id)
    print(f"slurm: job {job_id} queued", flush=True)
    state = poll_while(job_id, QUEUED, sbatch).get("JobState", "RUNNING")
    started = time.time()
    with open(args.marks, "w") as marks:
        json.dump({"job_id": int(job_id), "queue_entered": queued, "queue_left": started}, marks)
    print(f"slurm: job {job_id} {state} after {started - queued:.2f} s in the queue", flush=True)
    follow(job_id, sbatch)
    job = poll_while(job_id, ACTIVE, sbatch)
    code = exit_code(job) if sbatch.poll() is None else sbatch.returncode
    job = job if sbatch.returncode is None else job_fields(job_id)  # sbatch saw the end first
    sbatch.terminate()  # the job has ended: sbatch's own next poll may be 10 s away
    print(f"slurm: job {job_id} {job.get('JobState', 'ended')} ({job.get('Reason', '?')}), exit {code}")
    return code


if __name__ == "__main__":
    sys.exit(main())
