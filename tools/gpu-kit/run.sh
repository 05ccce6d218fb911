#!/usr/bin/env bash
# Runs ffdl's GPU checks on a GPU host, from the project's root, with the kit that
# `make gpu-kit` built beside the working tree (.gpu-kit/): installs it, shows where learners'
# cgroups go on this host, then runs the GPU tests, the memory-limit tests and both GPU
# benchmarks, sandboxed and with the manifests' ordinary memory limits. Logs go to $OUT
# (or a new temporary directory). Exits non-zero when a step failed.
#   bash .gpu-kit/run.sh [STEP...]    steps: gpu-tests gpu-overhead gpu-sampling (the default)
#                                      and fleet (only when named; FLEET_ARGS adds options)
set -u
export PYTHONUNBUFFERED=1
kit=.gpu-kit
out=${OUT:-$(mktemp -d)}
status=0
PY=${PYTHON:-$(command -v python3)}
log() { echo "=== $(date +%T) $*"; }
steps=${*:-gpu-tests gpu-overhead gpu-sampling}
step() {  # step NAME TIMEOUT COMMAND...: runs it, logs to $out/NAME.log, remembers a failure
  local name=$1 limit=$2
  shift 2
  case " $steps " in *" $name "*) ;; *) return ;; esac
  log "$name"
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  tail -n 30 "$out/$name.log"
  [ "$rc" = 0 ] || { echo "--- $name failed (exit $rc)"; status=1; }
}

log setup
nvidia-smi -L
$PY --version
missing=""
while read -r name; do
  name=${name%%#*}; name=${name// /}
  [ -z "$name" ] || $PY -m pip show -q "$name" >/dev/null 2>&1 || missing="$missing $name"
done < "$kit/host-packages.txt"
if [ -n "$missing" ]; then
  echo "this host lacks:$missing (remove them from tools/gpu-kit/host-packages.txt, then make gpu-kit)"
  exit 2
fi
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "$kit"/whl/*.whl 2>&1 | tail -3
$PY -m pip install -q --no-index --no-deps --no-build-isolation -e . 2>&1 | tail -3
$PY -c "import ffdl, torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" || exit 1
install -m 0755 "$kit/bin/bwrap" /usr/local/bin/bwrap
if ldd /usr/local/bin/bwrap | grep -q "not found"; then
  cp "$kit"/bin/*.so* /usr/local/lib/ && ldconfig
fi
bwrap --ro-bind / / --unshare-pid --die-with-parent true && echo "bwrap works"

log cgroups
echo "this process: $(grep '^0::' /proc/self/cgroup)"
own=/sys/fs/cgroup$(sed -n 's/^0:://p' /proc/self/cgroup)
echo "its subtree_control: '$(cat "$own/cgroup.subtree_control" 2>/dev/null)'"
echo "root's subtree_control: '$(cat /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null)'"
$PY -c "from ffdl.learner.cgroup_placement import discover; print(discover().describe())"

step gpu-tests 250 $PY -m pytest -q -p no:cacheprovider -rs tests/gpu tests/security/test_memory_limits.py --timeout 150
step gpu-overhead 200 $PY benchmarks/bench_gpu_overhead.py --runs 5
step gpu-sampling 80 $PY benchmarks/bench_gpu_sampling.py --rounds 5

# The fleet benchmark: 3 replicas and PostgreSQL pinned to CPUs 0 and 1, the simulated
# learners (8 harness processes) and the benchmark's clients on the host's other cores.
case " $steps " in *" fleet "*)
  log "fleet setup"
  # Unpacked whole: its binaries find their libraries at ../../../pgserver.libs.
  pg=/opt/ffdl-postgres
  if [ ! -x "$pg/pgserver/pginstall/bin/postgres" ]; then
    mkdir -p "$pg" && $PY -m zipfile -e "$kit"/postgres/pgserver-*.whl "$pg"
    chmod -R a+rX "$pg" && chmod 0755 "$pg"/pgserver/pginstall/bin/*
  fi
  id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
  ulimit -n 65536 2>/dev/null || true  # thousands of learners' connections
  echo "cores: $(nproc); $("$pg/pgserver/pginstall/bin/postgres" --version)"
  PATH="$pg/pgserver/pginstall/bin:$PATH" step fleet "${FLEET_TIMEOUT:-300}" $PY benchmarks/fleet.py \
    --nodes 10000 --stored 100000 --setups postgres:3 --learners 2000 --duration 75 \
    --window 30 --harnesses 8 --platform-cpus 0,1 ${FLEET_ARGS:-}
;; esac
log "done (status $status)"
exit $status
