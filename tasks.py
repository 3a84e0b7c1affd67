"""dtlab's Invoke entry point: declarations only; the logic lives in the `dtlab` package.

    invoke --list            the manual
    invoke lab.up            the local three-node lab (the default target)
    invoke bench.all         the benchmark matrix over SSH
    invoke cluster.reset     back to a clean, known state
"""

from invoke import Collection, task

# --- lab ---------------------------------------------------------------------


# --- cluster -----------------------------------------------------------------


# --- trainer -----------------------------------------------------------------


# --- bench -------------------------------------------------------------------


# --- top level ---------------------------------------------------------------

lab = Collection("lab")
cluster = Collection("cluster")
trainer = Collection("trainer")
bench = Collection("bench")

ns = Collection(lab, cluster, trainer, bench)
