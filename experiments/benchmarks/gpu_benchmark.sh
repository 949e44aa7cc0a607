#!/usr/bin/env bash
# One-shot GPU benchmark (issue 14) for a lent GPU machine WITHOUT network: about 5 minutes
# (the time boxes sum to 310 s; whatever a step finished is kept, so a slow step costs its own
# results only). It comes first on a lent machine; agents/train_gpu.sh gets the rest.
#
# Here, once (PyPI reachable):   bash experiments/benchmarks/gpu_wheels.sh     # Captum, pytorch-grad-cam -> .whl/
# There, as ONE command, carrying .whl:
#   bash experiments/benchmarks/gpu_benchmark.sh           # $OUT/gpu_benchmark.tgz (results) + gpu_benchmark.log
#   bash experiments/benchmarks/gpu_benchmark.sh --quick   # tiny sizes: the whole script end to end, any backend
# Back here:  mkdir -p experiments/results/gpu && tar -xzf DIR/gpu_benchmark.tgz -C experiments/results/gpu
#
# Installs nothing from the network. The machine's python3 brings jax (CUDA), flax, optax, chex,
# orbax, scikit-image and torch; the checkout is imported in place (PYTHONPATH, agents/ under its
# installed name jaxsal_agents: agents/checkout_env.sh); the wheels in .whl/ go into a temporary
# directory with `pip install --no-index`. Steps, most important first, each under its own
# timeout (a failed step is logged and the next one runs):
#   1. jaxsal against Captum / pytorch-grad-cam / torch on the same GPU: maps/s per method at
#      batch 256, 4,096 and 16,384, interleaved, after an agreement check (goal >= 3x)
#   2. vanilla gradient at large batches, 16,384 rows per call (goal >= 1M maps/s), and its peak
#      GPU memory (one method per process)
#   3. occlusion 2x2 / stride 2 at a large batch (goal >= 2,000 maps/s)
#   4. `jaxsal explain` end to end on a 1M-frame replay buffer on disk (gradcam, gradient)
#   5. peak GPU memory per method and side, each in a fresh process (as many as fit its time box)
set -uo pipefail
cd "$(dirname "$0")/../.."
QUICK=0
[ "${1:-}" = "--quick" ] && QUICK=1
PY=${PYTHON:-python3}
DEST=${OUT:-runs/gpu-bench}
RES=$(mktemp -d "${TMPDIR:-/tmp}/jaxsal-gpu-bench.XXXXXX")
mkdir -p "$DEST"
LOG="$DEST/gpu_benchmark.log"
: > "$LOG"
say() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$LOG"; }
export PYTHONUNBUFFERED=1

if compgen -G ".whl/*.whl" >/dev/null; then
  SITE=$(mktemp -d "${TMPDIR:-/tmp}/jaxsal-site.XXXXXX")
  say "installing $(ls .whl | tr '\n' ' ')(no network: --no-index)"
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .whl/*.whl >>"$LOG" 2>&1 \
    || { say "pip install --no-index of .whl/ failed (see the log)"; exit 2; }
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
$PY -c "import jaxsal" 2>/dev/null || export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
source agents/checkout_env.sh   # agents/ importable as jaxsal_agents without installing
$PY -c "import jaxsal, jaxsal_agents.networks, torch, captum" >>"$LOG" 2>&1 || {
  say "missing packages (see the log): run 'bash experiments/benchmarks/gpu_wheels.sh' where PyPI is reachable and carry .whl"
  exit 2; }
BACKEND=$($PY -c "import jax; print(jax.default_backend())" 2>>"$LOG")
say "backend: $BACKEND; jax devices: $($PY -c 'import jax; print(jax.devices())' 2>/dev/null); torch cuda: $($PY -c 'import torch; print(torch.cuda.is_available())' 2>/dev/null)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >>"$LOG" 2>&1
[ "$BACKEND" = "gpu" ] || [ $QUICK = 1 ] || say "WARNING: jax's backend is '$BACKEND', not gpu: these are not GPU figures"

if [ $QUICK = 1 ]; then
  PEER_B="2 4"; PEER_BUDGET=1; GRAD_B="8"; OCC_B="2"; BS="--batch-size 8"; FRAMES=2048; REP=1
  T_PEERS=300; T_GRAD=300; T_OCC=300; T_BUF=300; T_MEM=300
  PEER_METHODS=("gradient" "gradcam conv3" "occlusion (2x2, stride 2)")
else  # time boxes sum to 310 s
  PEER_B="256 4096 16384"; PEER_BUDGET=1; GRAD_B="32768 131072"; OCC_B="4096"; BS="--batch-size 16384"
  FRAMES=1048576; REP=2
  T_PEERS=130; T_GRAD=30; T_OCC=30; T_BUF=100; T_MEM=20
  PEER_METHODS=()
fi
TAG=${BACKEND:-unknown}
PEAK=""
[ "$BACKEND" = "gpu" ] && PEAK="--peak-gflops 67000"   # H200 FP32 (non-tensor) spec sheet, for the % peak column
step() {  # step NAME TIMEOUT COMMAND...: one step, logged, under its own timeout
  local name=$1 t=$2; shift 2
  say "step $name (timeout $t s)"
  timeout "$t" "$@" >>"$LOG" 2>&1 || say "step $name failed or timed out (rc $?)"
}
# jax and torch share the GPU in the peer steps: jax takes at most 45% of its memory up front
step peers $T_PEERS env XLA_PYTHON_CLIENT_MEM_FRACTION=0.45 $PY -m experiments.benchmarks.against_peers \
  --out "$RES/peers" --batches $PEER_B --budget $PEER_BUDGET --repeats $REP --torch-threads "$(nproc)" \
  --no-memory --scaling $PEAK ${PEER_METHODS:+--methods "${PEER_METHODS[@]}"}
step gradient_large $T_GRAD $PY -m experiments.benchmarks.throughput --out "$RES" --tag "${TAG}_gradient_large" \
  --batches $GRAD_B --budget 3 --repeats $REP $BS --methods gradient
step occlusion_large $T_OCC $PY -m experiments.benchmarks.throughput --out "$RES" --tag "${TAG}_occlusion_large" \
  --batches $OCC_B --budget 3 --repeats $REP $BS --methods "occlusion (2x2/2)" "occlusion (2x2/2, plain path)"
step buffer_1m $T_BUF $PY -m experiments.benchmarks.buffer_end_to_end --out "$RES" --tag "$TAG" --frames $FRAMES \
  --methods gradcam gradient --timeout $(( (T_BUF - 10) / 2 ))
step peer_memory $T_MEM env XLA_PYTHON_CLIENT_MEM_FRACTION=0.45 $PY -m experiments.benchmarks.against_peers \
  --out "$RES/peers" --memory-only --torch-threads "$(nproc)" ${PEER_METHODS:+--methods "${PEER_METHODS[@]}"}
tar -czf "$DEST/gpu_benchmark.tgz" -C "$RES" . && say "done: $DEST/gpu_benchmark.tgz holds $(cd "$RES" && find . -type f | sort | tr '\n' ' ')"
rm -rf "$RES"
