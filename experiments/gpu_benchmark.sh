#!/usr/bin/env bash
# One-shot GPU benchmark (issue 8): run as ONE command on a machine with an NVIDIA GPU: at most
# 8 min of benchmark steps (4 + 2 + 2, each under its own timeout) plus the install.
#
#   bash experiments/gpu_benchmark.sh            # writes $OUT (or experiments/results) throughput_gpu*.{md,json}
#   bash experiments/gpu_benchmark.sh --quick    # tiny sizes: checks the script end to end (any backend)
#
# Installs only what pyproject declares (pip install -e '.[test]') plus jax[cuda12] when jax's
# backend is not already gpu. Every step has its own timeout, so one slow case cannot eat the
# budget; a failed step is logged and the next one runs. Results: throughput_<tag>.{md,json}.
set -uo pipefail
cd "$(dirname "$0")/.."
QUICK=0
[ "${1:-}" = "--quick" ] && QUICK=1
PY=${PYTHON:-python}
DEST=${OUT:-experiments/results}
mkdir -p "$DEST"
LOG="$DEST/gpu_benchmark.log"
: > "$LOG"
say() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$LOG"; }

$PY -c "import jaxsal" 2>/dev/null || { say "pip install -e .[test]"; $PY -m pip install -q -e '.[test]' >>"$LOG" 2>&1; }
source agents/checkout_env.sh   # when not installed: agents/ importable under its installed name jaxsal_agents
BACKEND=$($PY -c "import jax; print(jax.default_backend())" 2>/dev/null)
if [ "$BACKEND" != "gpu" ] && [ $QUICK = 0 ]; then
  JAXV=$($PY -c "import jax; print(jax.__version__)")
  say "backend is '$BACKEND': pip install jax[cuda12]==$JAXV"
  $PY -m pip install -q "jax[cuda12]==$JAXV" >>"$LOG" 2>&1 || say "jax[cuda12] install failed"
  BACKEND=$($PY -c "import jax; print(jax.default_backend())" 2>/dev/null)
fi
say "backend: $BACKEND; devices: $($PY -c 'import jax; print(jax.devices())' 2>/dev/null)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >>"$LOG" 2>&1

if [ $QUICK = 1 ]; then
  B1="2"; B2="4"; BIG="2"; BS="--batch-size 8"; BUDGET=1; T=300; REP=1
else
  B1="256 4096"; B2="32768 131072"; BIG="4096"; BS="--batch-size 16384"; BUDGET=12; T=120; REP=3
fi
TAG=${BACKEND:-unknown}
step() {  # step NAME TIMEOUT ARGS... : one throughput run, results under its own tag
  local name=$1 t=$2; shift 2
  say "step $name"
  timeout "$t" $PY -m experiments.throughput --out "$DEST" --tag "${TAG}_$name" --repeats $REP "$@" \
    >>"$LOG" 2>&1 || say "step $name failed or timed out (rc $?)"
}
# 1. gradient and CAM methods, IG, occlusion at Paper B's parameters (2x2, stride 2) both paths,
#    noise sensitivity and RISE at batch 256 and 4096 (default rows per call: 4096 on accelerators)
step main $((T * 2)) --batches $B1 --budget $BUDGET --methods gradient guided_backprop gradcam \
  gradcam_pp "integrated_gradients (steps=50)" "occlusion (2x2/2)" "occlusion (2x2/2, plain path)" \
  "noise_sensitivity (r3/3)" "rise (1000 masks)"
# 2. vanilla gradient at large batches and 16k rows per call: aims at >= 1M maps/s on an H200
step gradient_large $T --batches $B2 --budget $BUDGET $BS --methods gradient
# 3. occlusion with more rows per call (Paper B parameters; goal >= 2,000 maps/s on an H200)
step occlusion_large $T --batches $BIG --budget $BUDGET $BS --methods "occlusion (2x2/2)" \
  "occlusion (2x2/2, plain path)"
say "done: $(ls "$DEST"/throughput_"${TAG}"_*.md 2>/dev/null | tr '\n' ' ')"
