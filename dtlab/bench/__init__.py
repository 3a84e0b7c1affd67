"""bench.run (one cell) and bench.all (the matrix): preflight, launch, follow, fetch, record, retry.

Before a matrix's first cell the health gate (dtlab.doctor) judges the whole cluster: a failed gate
stops the matrix before anything is reserved or written. After a cell fails on a node, the gate
re-checks that node; a node that fails is drained, and the matrix's later cells that need it skipped.

One attempt of one cell:
  1. the store reserves an attempt folder (live logs are streamed straight into it);
  2. preflight: every node the cell needs answers over SSH and has the trainer env; the services it
     needs are up (Spark master, Ray head with enough alive workers);
  3. the launcher's units start on all their nodes at once; the first one to fail stops the others,
     and the unit watch stops them when a node falls silent or a unit ends under an open log stream;
  4. rank 0's result.json is fetched and recorded; or the failure (node, exit code, last log lines).
A failed attempt is cleaned up on every node and retried (default once) from the trainer's checkpoint,
once every node answers again (bounded wait). Ctrl-C stops the cell's units on every node; recorded
results are never touched. What the user sees is dtlab.display; the command bodies, dtlab.commands.

The modules, one per step: runner (Bench, the orchestrator: the matrix, its cells, their attempts),
options (BenchOptions), gate (the health gate), prepare (preflight, prepare), execute (the units or the
external job; stopping a cell), watch (UnitWatch), record (fetch the result, record the attempt).
"""

from dtlab.bench.options import BenchOptions
from dtlab.bench.runner import Bench, git_revision
from dtlab.bench.watch import UnitWatch
from dtlab.display import Display
from dtlab.platforms import PreflightError

__all__ = ["Bench", "BenchOptions", "Display", "PreflightError", "UnitWatch", "git_revision"]
