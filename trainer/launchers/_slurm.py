"""What the Slurm launcher asks Slurm's clients (on the master, as the submitting user)."""

import subprocess
import sys
import time

POLL_S = 0.1  # the resolution of the queue wait and of the job's end; slurmctld answers from memory
QUEUED = ("PENDING", "CONFIGURING")
ACTIVE = (*QUEUED, "RUNNING", "COMPLETING", "SUSPENDED")


def ask(*argv: str) -> str:
    """One client call's output; '' when it fails (slurmctld away, the job gone)."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip()
    except subprocess.TimeoutExpired:
        return ""


def job_fields(job_id: str) -> dict[str, str]:
    """`scontrol show job`'s fields (JobState, Reason, ExitCode...), kept MinJobAge (300 s) after its end."""
    return dict(f.split("=", 1) for f in ask("scontrol", "show", "job", "-o", job_id).split() if "=" in f)


def poll_while(job_id: str, states: tuple[str, ...], sbatch: subprocess.Popen) -> dict[str, str]:
    """The job's fields once it has left `states`. While scontrol does not answer, sbatch --wait (which
    ends with the job, bounded by its --time) decides: the poll ends when sbatch does."""
    job: dict[str, str] = {}
    while sbatch.poll() is None and (job := job_fields(job_id)).get("JobState", states[0]) in states:
        time.sleep(POLL_S)
    return job


def exit_code(job: dict[str, str]) -> int:
    """The ended job's exit code as a shell gives it: "1:0" is 1, "0:15" (killed by SIGTERM) 143; a job
    that did not complete is never 0 (TIMEOUT and NODE_FAIL can read 0:0)."""
    status, _, signal_number = job.get("ExitCode", "0:0").partition(":")
    code = int(status or 0) or (128 + int(signal_number) if signal_number not in ("", "0") else 0)
    return code or int(job.get("JobState", "COMPLETED") != "COMPLETED")


def attach(step: str) -> bool:
    """Stream the step's output (sattach) until it ends: True. False at once when some task has not
    started yet (sattach would follow only the others): the caller tries again."""
    with subprocess.Popen(["sattach", step], stderr=subprocess.PIPE, text=True) as sattach:
        for line in sattach.stderr:  # the tasks' stderr, and sattach's own complaints
            if "no tasks running" in line:
                sattach.terminate()
                return False
            sys.stderr.write(line)
            sys.stderr.flush()
    return True
