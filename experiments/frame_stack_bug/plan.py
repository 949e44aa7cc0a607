"""The frozen plan of the pre-registered frame-stack-bug study: the one source of truth for
seeds, variants, budgets, snapshot and checkpoint schedules, the statistic's parameters and the
decision rule's levels. experiments/frame_stack_bug/preregistration.md describes and cites it;
experiments.frame_stack_bug.run reads every number from here. Do not edit after the
pre-registration commit: a changed plan is a new study (new seeds, new file).

Two studies:
  - MINATAR: MinAtar Breakout, trail channel dropped, 4-frame host stack; the correct stack and
    all four bugs; seeds 100-107 (never used before; earlier runs used 0-5); 96k env steps.
  - ATARI: EnvPool Breakout, 4-frame host stack, dueling Double-DQN (PQN trainer with a target
    network synced every 8 updates, `--arch dueling --target-every 8`); the correct stack,
    `reuse` and `reversed`; seeds 100-104; 409,600 env steps (1.64M frames).
"""
from __future__ import annotations

import dataclasses

# --- the statistic (experiments.frame_stack_bug.stats.stack_age_gain), frozen -------------------------------
FRAME_METHODS = ("grad_x_input", "gradient", "guided_backprop")   # averaged, as in jaxsal_agents.snapshots
SNAPSHOT_METHODS = ("gradcam", "g1gradcam", "g2gradcam", "guided_backprop", "gradient")
TARGET = "q_chosen"           # the explained output: Q of the greedy action
WINDOW = 4                    # snapshots in the causal trailing mean
BASELINE = "first snapshot (after update 1)"
N_PROBES = 16                 # probe states: jaxsal_agents.snapshots.probe_states(env, 16, steps=64, seed=0)
PROBE_STEPS = 64
PROBE_ENV_SEED = 10_000       # the probe env's seed, the same for every variant and seed
PROBE_POLICY_SEED = 0

# --- the return statistic, frozen ------------------------------------------------------------
RETURN_GAMES = 20             # mean of the last 20 full-game returns finished before the checkpoint
RETURN_IF_NO_GAME = 0.0       # a run with no finished game yet scores 0 (Breakout's minimum)

# --- the decision rule (experiments.frame_stack_bug.detection_rule), frozen ----------------------------------
FAMILY_ALPHA = 0.05           # family-wise error per signal (maps; returns), over bugs and checkpoints
SIGNALS = {"saliency": "stack_age_gain", "return": "return_mean"}   # two families, reported separately
SECONDARY = {"saliency_old": "newest_share_gain"}                   # descriptive only, same rule
BOOTSTRAP = {"n_boot": 1000, "seed": 0, "level": 0.95}              # stability interval of the step
PREDICTED_SALIENCY_DIRECTION = {"reuse": "-", "reversed": "+", "no_update": "+", "misaligned": None}
RANDOM_BREAKOUT_RETURN = 1.7  # random-policy full-game return (Mnih et al. 2015, Extended Data Table 2)
LEARNED_FACTOR = 2.0          # "correct agent learned": its seed-mean final return >= 2 x random


@dataclasses.dataclass(frozen=True)
class Study:
    name: str
    game: str
    variants: tuple            # "correct" first, then bug names of jaxsal_agents.framestack.BUGS
    seeds: tuple
    steps: int                 # env steps per run (all envs together)
    num_envs: int
    rollout: int
    lr: float
    epochs: int
    minibatches: int
    arch: str                  # "minatar" (jaxsal_agents.networks.MinAtarDQN) or "dueling" (Nature-CNN dueling)
    target_every: int          # 0: PQN without target net; K: Double-DQN target synced every K updates
    frames: int
    drop_trail: bool
    snapshot_every: int        # updates between snapshots (plus one after update 1: the baseline)
    checkpoint_every: int      # updates between the rule's checkpoints (a multiple of snapshot_every)

    @property
    def bugs(self) -> tuple:
        return tuple(v for v in self.variants if v != "correct")

    @property
    def steps_per_update(self) -> int:
        return self.num_envs * self.rollout

    @property
    def updates(self) -> int:
        return self.steps // self.steps_per_update

    @property
    def checkpoint_updates(self) -> list[int]:
        return list(range(self.checkpoint_every, self.updates + 1, self.checkpoint_every))

    @property
    def checkpoints(self) -> list[int]:
        """The rule's checkpoints as env steps (the step counter after that update)."""
        return [u * self.steps_per_update for u in self.checkpoint_updates]

    @property
    def alpha(self) -> float:
        """Per-bug level: the family's alpha, Bonferroni-split over the bugs."""
        return FAMILY_ALPHA / len(self.bugs)

    @property
    def learned_threshold(self) -> float:
        return LEARNED_FACTOR * RANDOM_BREAKOUT_RETURN


MINATAR = Study(
    name="minatar", game="minatar-breakout",
    variants=("correct", "reuse", "no_update", "reversed", "misaligned"),
    seeds=tuple(range(100, 108)), steps=96_000, num_envs=32, rollout=16, lr=3e-3, epochs=4,
    minibatches=4, arch="minatar", target_every=0, frames=4, drop_trail=True,
    snapshot_every=4, checkpoint_every=8)

ATARI = Study(
    name="atari", game="breakout",
    variants=("correct", "reuse", "reversed"),
    seeds=tuple(range(100, 105)), steps=409_600, num_envs=16, rollout=32, lr=2.5e-4, epochs=2,
    minibatches=4, arch="dueling", target_every=8, frames=4, drop_trail=False,
    snapshot_every=16, checkpoint_every=32)

STUDIES = {s.name: s for s in (MINATAR, ATARI)}
