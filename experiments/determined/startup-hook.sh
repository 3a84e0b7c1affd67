# Determined sources this file from the top of the context directory in every task container,
# before the entrypoint starts. As in the study (chapter 4.4.3), it installs the trainer's Python
# dependencies there, because a requirements file did not install reliably inside the containers.
# requirements.txt and constraints.txt are written next to it by dtlab.detconfig.stage_context
# (from pyproject.toml and the repository's one pin list). DTLAB_PIP_OPTIONS adds pip options,
# e.g. "--no-index --find-links /wheelhouse" on agents without a package index.
# shellcheck shell=bash
echo "dtlab startup hook: installing the trainer's dependencies (constraints.txt)"
# shellcheck disable=SC2086  # DTLAB_PIP_OPTIONS is a list of options
python3 -m pip install --no-cache-dir --disable-pip-version-check --quiet \
    --constraint constraints.txt --requirement requirements.txt ${DTLAB_PIP_OPTIONS:-} \
    || { echo "dtlab startup hook: pip install failed" >&2; exit 1; }
