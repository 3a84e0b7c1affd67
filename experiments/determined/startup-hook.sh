# Determined sources this file from the top of the context directory in every task container,
# before the entrypoint starts. As in the study (chapter 4.4.3), it installs the trainer's Python
# dependencies there, because a requirements file did not install reliably inside the containers.
# requirements.txt and constraints.txt are written next to it by dtlab.platforms.determined.config.stage_context
# (from pyproject.toml and the repository's one pin list). DTLAB_PIP_OPTIONS adds pip options,
# e.g. "--no-index --find-links /wheelhouse" on agents without a package index.
# DTLAB_TORCH_REQUIREMENTS names the torch build the trainer role chose for the cluster's GPUs: a
# requirements file on the agent (dtlab_torch_build_dir, bind-mounted read-only by the harness) with
# the build's --extra-index-url and torch==<pin>+<build>, the same as the nodes' venvs.
# shellcheck shell=bash
echo "dtlab startup hook: installing the trainer's dependencies (constraints.txt)"
dtlab_torch_build=()
if [ -n "${DTLAB_TORCH_REQUIREMENTS:-}" ]; then
    [ -f "$DTLAB_TORCH_REQUIREMENTS" ] || { echo "dtlab startup hook: no torch build file" \
        "$DTLAB_TORCH_REQUIREMENTS on this agent; run ansible-playbook site.yml --tags trainer" >&2; exit 1; }
    dtlab_torch_build=(--requirement "$DTLAB_TORCH_REQUIREMENTS")
fi
# shellcheck disable=SC2086  # DTLAB_PIP_OPTIONS is a list of options
python3 -m pip install --no-cache-dir --disable-pip-version-check --quiet \
    --constraint constraints.txt --requirement requirements.txt "${dtlab_torch_build[@]}" ${DTLAB_PIP_OPTIONS:-} \
    || { echo "dtlab startup hook: pip install failed" >&2; exit 1; }
