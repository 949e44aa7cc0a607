#!/usr/bin/env bash
# Train the shipped Atari agents on a lent GPU machine (no network) and bring back their params.
#
# Here, once (PyPI reachable):   .venv/bin/python -m jaxsal_agents.gpu_bundle     # EnvPool for cp312, ~14 MB
# There, as ONE command, carrying .gpu_bundle:
#   bash agents/train_gpu.sh 6                # minutes of training (all agents in parallel)
#   bash agents/train_gpu.sh --quick          # any machine: 2 agents, 40 s, small batches
# Back here:  .venv/bin/python -m jaxsal_agents.adopt_gpu DIR   # DIR: where the $OUT files landed
#
# Every agent continues from its shipped (committed) parameters (`--init-from`), so repeated GPU
# sessions add up; all run at once, sharing the GPU (each a tenth of its memory) and the CPU
# cores (EnvPool threads split between them). At the end each is exported in float16 with a
# 30-game evaluation card; $OUT/<name>.tgz holds <name>.msgpack, <name>.json, returns.csv and
# the log (at most 8 files come back: 6 agents + the log of the whole run).
set -uo pipefail
cd "$(dirname "$0")/.."
MIN=${1:-6}
QUICK=0
[ "$MIN" = "--quick" ] && { QUICK=1; MIN=0.67; }
DEST=${OUT:-runs/gpu-out}
RUNS=${RUNS:-/tmp/jaxsal-gpu-runs}
mkdir -p "$DEST" "$RUNS"
LOG="$DEST/train_gpu.log"
: > "$LOG"
say() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$LOG"; }
PY=${PYTHON:-python3}
[ -d .gpu_bundle/site ] && export PYTHONPATH="$PWD/.gpu_bundle/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH="${PYTHONPATH:-$PWD}" XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
source agents/checkout_env.sh   # not pip-installed there: agents/ importable as jaxsal_agents
$PY -c "import envpool, flax, optax, orbax.checkpoint" 2>>"$LOG" || {
  say "missing packages (EnvPool comes from .gpu_bundle: run python -m jaxsal_agents.gpu_bundle here and carry it)"; exit 2; }
say "backend: $($PY -c 'import jax; print(jax.default_backend(), jax.devices())' 2>>"$LOG")"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >>"$LOG" 2>&1

# name game arch extra-flags (the shipped agents; each starts from its committed params)
AGENTS=("pong pong dqn" "breakout breakout dqn" "breakout-dddqn breakout dueling --target-every 8"
        "mspacman mspacman dqn" "spaceinvaders spaceinvaders dqn" "frostbite frostbite dqn")
if [ $QUICK = 1 ]; then
  AGENTS=("${AGENTS[0]}" "${AGENTS[2]}"); SIZE="--num-envs 8 --rollout 8 --minibatches 2"; EPISODES=2
else
  SIZE="--num-envs 128 --rollout 32 --minibatches 32"; EPISODES=30
fi
CORES=$(nproc)
THREADS=$(( CORES / ${#AGENTS[@]} )); [ $THREADS -lt 1 ] && THREADS=1
SECS=$($PY -c "print(int(float('$MIN') * 60))")
say "training ${#AGENTS[@]} agents for $SECS s each, $THREADS EnvPool threads each"
pids=()
for spec in "${AGENTS[@]}"; do
  set -- $spec
  name=$1 game=$2 arch=$3; shift 3
  init=""
  [ -f "agents/shipped/$name.json" ] && init="--init-from $name"
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.1 $PY -m jaxsal_agents.train --game "$game" --arch "$arch" $SIZE --steps 10000000 \
    --env-threads $THREADS --ckpt-every 50 --time-limit "$SECS" --run-dir "$RUNS/$name" $init "$@" \
    > "$RUNS/$name.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || say "a training process ended with rc $?"; done
for spec in "${AGENTS[@]}"; do
  set -- $spec
  name=$1
  tail -n 2 "$RUNS/$name.log" | tee -a "$LOG"
  out="$RUNS/export/$name"
  mkdir -p "$out"
  if $PY -m jaxsal_agents.export --run-dir "$RUNS/$name" --name "$name" --episodes $EPISODES --out-dir "$out" \
      >>"$RUNS/$name.log" 2>&1; then
    cp "$RUNS/$name/returns.csv" "$RUNS/$name.log" "$out/"
    tar -czf "$DEST/$name.tgz" -C "$out" .
    say "$name: $(tail -n 1 "$RUNS/$name.log")"
  else
    say "$name: export failed (see $name.log)"; cp "$RUNS/$name.log" "$DEST/" 2>/dev/null
  fi
done
say "done: $(ls "$DEST" | tr '\n' ' ')"
