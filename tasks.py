"""dtlab's Invoke entry point: declarations only; the logic lives in the `dtlab` package.

    invoke --list            the manual
    invoke lab.up            the local three-node lab (the default target)
    invoke bench.all         the benchmark matrix over SSH
    invoke cluster.reset     back to a clean, known state
"""

import os
import sys
from pathlib import Path

from invoke import Collection, task

# Tools installed beside this interpreter (ansible-playbook, pytest, ruff) win over any on PATH,
# so `.venv/bin/invoke ...` works without activating the venv.
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"

# --- lab ---------------------------------------------------------------------


# --- cluster -----------------------------------------------------------------


# --- trainer -----------------------------------------------------------------


# --- bench -------------------------------------------------------------------


# --- top level ---------------------------------------------------------------

LINTERS = ("ruff check .", "yamllint -s .", "ansible-lint --profile production --offline")


@task(help={"lint": "run ruff, yamllint and ansible-lint first (default: yes)",
            "pytest_args": "extra pytest arguments, e.g. '-k report -x'"})
def test(c, lint=True, pytest_args=""):
    """Lint, then run the whole test suite (this is what CI runs)."""
    if lint:
        for command in LINTERS:
            c.run(command, echo=True)
    c.run(f"pytest {pytest_args}", echo=True, pty=False)


lab = Collection("lab")
cluster = Collection("cluster")
trainer = Collection("trainer")
bench = Collection("bench")

ns = Collection(lab, cluster, trainer, bench, test)
