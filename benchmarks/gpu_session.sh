# Helpers for a GPU session's script (sourced): the staged vLLM's environment, and detached jobs
# that outlive the device call that started them (a call's time limit must not orphan a vLLM server).
#   bg NAME COMMAND        run COMMAND detached; log /tmp/bg/NAME.log, exit code /tmp/bg/NAME.rc
#   wait_for SECONDS NAME  poll until every NAME finished or SECONDS passed, then `collect`
#   collect                everything under /tmp/bg and the /tmp dirs named in $TAR_DIRS, as $OUT/bg.tgz
#                          (one file: a call returns only a few)
source /tmp/gpu-vllm/env.sh
export PYTHONPATH=$PWD/src:$PYTHONPATH
export VLLM_ALLREDUCE_USE_SYMM_MEM=0  # symmetric-memory all-reduce can use NVLink multicast: kept off here
M=/tmp/hotweights-models
mkdir -p /tmp/bg
bg() {
  local name=$1; shift
  rm -f /tmp/bg/$name.rc
  setsid nohup bash -c "( $* ) > /tmp/bg/$name.log 2>&1; echo \$? > /tmp/bg/$name.rc" > /dev/null 2>&1 &
  echo "started $name"
}
collect() {
  local dirs=bg
  for d in ${TAR_DIRS:-}; do [ -d /tmp/$d ] && dirs="$dirs $d"; done
  tar czf "$OUT/bg.tgz" -C /tmp $dirs
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader
}
wait_for() {
  local limit=$1; shift
  local t=0
  while [ $t -lt $limit ]; do
    local pending=0
    for n in "$@"; do [ -f /tmp/bg/$n.rc ] || pending=1; done
    [ $pending = 0 ] && break
    sleep 5; t=$((t + 5))
  done
  for n in "$@"; do
    echo "== $n: $([ -f /tmp/bg/$n.rc ] && echo "exit $(cat /tmp/bg/$n.rc)" || echo running)"
    tail -3 /tmp/bg/$n.log | cut -c1-600
  done
  collect
}
