#!/usr/bin/env bash
# The install a user does: build the wheel, install it into a fresh venv (base, then each extra) and run one
# command of each. `make check-wheel`; CI runs it after the lint. About a minute with the CPU torch at hand.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0+cpu}
TORCH_INDEX=${TORCH_INDEX-https://download.pytorch.org/whl/cpu}
work=$(mktemp -d "${TMPDIR:-/tmp}/hw-wheel-XXXXXX")
# (no `kill 0` where serve never started: that would signal this whole process group, make included)
trap '"$work/venv/bin/hotweights" stop --socket-dir "$work/sock" >/dev/null 2>&1 || true
      if [ -n "${serve_pid:-}" ]; then kill "$serve_pid" 2>/dev/null || true; fi; rm -rf "$work"' EXIT
step() { printf '\n== %s\n' "$*"; }

step "build the wheel"
rm -rf dist && $PYTHON -m pip wheel -q --no-deps -w dist .
wheel=$(ls dist/hotweights-*-py3-none-any.whl)
$PYTHON -c 'import sys, zipfile; sys.exit("hotweights/py.typed" not in zipfile.ZipFile(sys.argv[1]).namelist())' \
  "$wheel"  # typed (no pipe into grep -q: its early exit would break the lister's pipe)
echo "$wheel"

step "base: the daemon and the CLI, no torch"
$PYTHON -m venv "$work/venv"
pip="$work/venv/bin/python -m pip"
hw="$work/venv/bin/hotweights"
$pip install -q "$wheel"
$hw --version
! "$work/venv/bin/python" -c "import torch" 2>/dev/null || { echo "the base install pulled torch"; exit 1; }
$hw daemon --detach --socket-dir "$work/sock"
$hw status --json --socket-dir "$work/sock"
$hw demo-model "$work/tiny" --size tiny 2>&1 | tee "$work/missing.txt" && { echo "demo-model ran without [engine]"; exit 1; }
grep -q "PATH\[engine\]' (PATH: hotweights' wheel" "$work/missing.txt"  # the missing extra is named, and where
if $hw verify --model "$work/tiny" --out "$work/v" > "$work/verify.txt" 2>&1; then echo "verify ran bare"; exit 1; fi
cat "$work/verify.txt"; grep -q "\[serve\]'" "$work/verify.txt"; ! grep -q Traceback "$work/verify.txt"

step "[engine]: torch (the CPU build: install it first, or pip picks a CUDA build), preload"
TORCH_SPEC=$TORCH_SPEC TORCH_INDEX=$TORCH_INDEX bash .ci/install_torch.sh "$work/venv/bin/python"
$pip install -q "$wheel[engine]"
$hw demo-model "$work/tiny" --size tiny
$hw preload --model "$work/tiny" --socket-dir "$work/sock"

step "[serve]: the embedded server answers from the cache"
$pip install -q "$wheel[serve]"
port=$($PYTHON -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
$hw serve "$work/tiny" --port "$port" --model-loader-extra-config "{\"socket_dir\": \"$work/sock\", \"fallback\": false}" \
  > "$work/serve.log" 2>&1 &
serve_pid=$!
get() { $PYTHON -c 'import sys, urllib.request as u; u.urlopen(sys.argv[1], timeout=5)' "$1" 2>/dev/null; }
for _ in $(seq 120); do
  get "http://127.0.0.1:$port/health" && break
  kill -0 $serve_pid 2>/dev/null || { cat "$work/serve.log"; exit 1; }
  sleep 0.5
done
$PYTHON - "$port" <<'PY'
import json, sys, urllib.request
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/completions", method="POST",
                             data=json.dumps({"prompt": "hi", "max_tokens": 4}).encode(),
                             headers={"content-type": "application/json"})
print("completion:", json.load(urllib.request.urlopen(req, timeout=30))["choices"][0]["finish_reason"])
PY
grep "Mapped " "$work/serve.log"
kill $serve_pid && wait $serve_pid || true
$hw stop --socket-dir "$work/sock"

step "[cluster]: Ray Serve, and the application builder's config check"
$hw cluster --config "$work/none.toml" 2>&1 | tee "$work/cluster.txt" && { echo "cluster ran without [cluster]"; exit 1; }
grep -q "\[cluster\]'" "$work/cluster.txt"
$pip install -q "$wheel[cluster]"
printf '[cluster]\nrouter = "fast"\n[[model]]\nname = "tiny"\ncheckpoint = "%s"\n' "$work/tiny" > "$work/c.toml"
if $hw cluster --config "$work/c.toml" > "$work/cluster.txt" 2>&1; then echo "a bad [cluster] ran"; exit 1; fi
cat "$work/cluster.txt"; grep -q "router" "$work/cluster.txt"; ! grep -q Traceback "$work/cluster.txt"
"$work/venv/bin/python" -c "import hotweights.cluster.app, hotweights.cluster.router"
echo "wheel check: OK"
