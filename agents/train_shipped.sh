#!/usr/bin/env bash
# Train (or resume) the shipped Atari agents on this machine's CPUs, niced, then export them.
#
#   bash agents/train_shipped.sh breakout pong          # these two, in parallel, until LIMIT
#   LIMIT=3600 bash agents/train_shipped.sh              # all six, in parallel
#   EXPORT_ONLY=1 bash agents/train_shipped.sh breakout  # evaluate (30 games) and export now
#
# Runs live in $RUNS (default $HOME/jaxsal-runs, outside the work tree), so a later session on
# the same machine resumes each from its orbax checkpoint; when a run's checkpoint is gone it
# starts again from the committed parameters (--init-from NAME). Every run stops after LIMIT
# seconds (after a checkpoint) and is exported to agents/shipped/ with a 30-game card when it
# stops, so nothing trained is lost at the end of a session.
set -u
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
$PY -c "import importlib.util as u, sys; sys.exit(u.find_spec('jaxsal_agents') is None)" || {
  echo "$PY cannot import jaxsal_agents (the installed name of agents/): run $PY -m pip install -e . (or make venv)"
  exit 2; }
RUNS=${RUNS:-$HOME/jaxsal-runs}
LIMIT=${LIMIT:-7200}
mkdir -p "$RUNS"
# name -> game, arch, extra flags. One config for all: 32 envs x 32 steps per update, minibatch 128,
# 2 epochs, planned 5M env steps (20M frames: epsilon decays over the first 500k, lr over all).
declare -A SPEC=(
  [breakout]="breakout dqn"
  [pong]="pong dqn"
  [breakout-dddqn]="breakout dueling --target-every 8"
  [mspacman]="mspacman dqn"
  [spaceinvaders]="spaceinvaders dqn"
  [frostbite]="frostbite dqn"
)
NAMES=("$@")
[ ${#NAMES[@]} -eq 0 ] && NAMES=(breakout pong breakout-dddqn mspacman spaceinvaders frostbite)
pids=()
for name in "${NAMES[@]}"; do
  [ -n "${SPEC[$name]:-}" ] || { echo "unknown agent $name; known: ${!SPEC[*]}"; exit 2; }
  set -- ${SPEC[$name]}
  game=$1 arch=$2; shift 2
  [ -n "${EXPORT_ONLY:-}" ] && continue
  init=""
  [ -f "agents/shipped/$name.json" ] && init="--init-from $name"
  nice -n 5 $PY -m jaxsal_agents.train --game "$game" --arch "$arch" --steps 5000000 --num-envs 32 --rollout 32 \
    --minibatches 8 --epochs 2 --ckpt-every 25 --time-limit "$LIMIT" --run-dir "$RUNS/$name" $init "$@" \
    >> "$RUNS/$name.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
for name in "${NAMES[@]}"; do
  nice -n 5 $PY -m jaxsal_agents.export --run-dir "$RUNS/$name" --name "$name" --episodes 30 \
    --out-dir agents/shipped --curves-dir experiments/results/training
done
