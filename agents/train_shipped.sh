#!/usr/bin/env bash
# How the shipped agents were trained in this session (2 shared CPU cores, time-limited, resumable):
# rerun it to continue every run where it stopped, then export with agents/export.py.
set -u
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
LIMIT=${LIMIT:-6600}   # seconds per run (per invocation)
mkdir -p runs
for spec in "breakout dqn breakout" "pong dqn pong" "breakout dueling breakout-dddqn" \
            "spaceinvaders dqn spaceinvaders"; do
  set -- $spec
  $PY -m agents.train --game "$1" --arch "$2" --steps 600000 --num-envs 16 --ckpt-every 25 \
      --time-limit "$LIMIT" --run-dir "runs/$3" > "runs/$3.log" 2>&1 &
done
for g in breakout spaceinvaders asterix freeway; do
  $PY -m agents.train --game "minatar-$g" --steps 1000000 --num-envs 64 --ckpt-every 25 \
      --time-limit 900 --run-dir "runs/minatar-$g" > "runs/minatar-$g.log" 2>&1
done
wait
for name in breakout pong breakout-dddqn spaceinvaders minatar-breakout minatar-spaceinvaders minatar-asterix minatar-freeway; do
  $PY -m agents.export --run-dir "runs/$name" --name "$name" --episodes 10
done
