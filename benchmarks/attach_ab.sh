#!/usr/bin/env bash
# attach_cpu.py (the whole stack: preload, daemon, attach) from two source trees, interleaved, 4 rounds in ABBA
# order; one JSON line per run. Run: BEFORE=OLD/src bash benchmarks/attach_ab.sh
set -e
cd "$(dirname "$0")/.."
BEFORE=${BEFORE:?the source tree before, e.g. git archive OLD src | tar -x -C /tmp/old; BEFORE=/tmp/old/src}
for r in 1 2 3 4; do
  if [ $((r % 2)) = 1 ]; then order="before after"; else order="after before"; fi
  for side in $order; do
    src=$PWD/src; [ $side = before ] && src=$BEFORE
    line=$(PYTHONPATH=$src .venv/bin/python benchmarks/attach_cpu.py --size 1g --repeat 5 --json)
    echo "{\"round\": $r, \"side\": \"$side\", \"result\": $line}"
  done
done
