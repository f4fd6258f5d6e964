#!/usr/bin/env bash
# torch's CPU build into the venv of PYTHON (the first argument), quietly: first from what pip already reaches (a
# wheel on disk, a mirror), then from TORCH_INDEX. Asking pip the index first where it cannot be reached printed a
# retry warning for each of torch's packages (issue 68); a CPU build not found anywhere is one line and exit 1.
# `make`'s venvs and .ci/wheel_check.sh; TORCH_SPEC, TORCH_INDEX as in the Makefile (TORCH_INDEX= : none).
set -euo pipefail
py=${1:?usage: install_torch.sh PYTHON}
spec=${TORCH_SPEC:-torch==2.13.0+cpu}
index=${TORCH_INDEX-https://download.pytorch.org/whl/cpu}
log=$(mktemp "${TMPDIR:-/tmp}/hw-torch-XXXXXX")
trap 'rm -f "$log"' EXIT
if "$py" -m pip install -q "$spec" > "$log" 2>&1; then
  exit 0
fi
if [ -z "$index" ]; then
  cat "$log" >&2
  exit 1
fi
if ! "$py" -m pip install -q "$spec" --extra-index-url "$index" --retries 1 > "$log" 2>&1; then
  echo "could not install $spec: not on disk or this machine's package index, and $index did not have it" \
       "(set TORCH_SPEC/TORCH_INDEX; pip said:)" >&2
  tail -5 "$log" >&2
  exit 1
fi
