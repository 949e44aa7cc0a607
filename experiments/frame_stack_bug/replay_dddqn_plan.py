"""The plan of the replay-DDDQN study (issue 32 item 4, redesigned in issue 41 item 4): the one
source of truth for its seeds, variants, budget, trainer settings, snapshot and checkpoint
schedules, return statistic and the rule's levels. experiments/frame_stack_bug/replay_dddqn_preregistration.md
describes and cites it; experiments.frame_stack_bug.study runs and analyses it (`--study
replay_dddqn`). DRAFT until the registration's status line says frozen; after that commit a
changed plan is a new study (new seeds, new file).

Paper A's own setting on MinAtar: a replay-buffer DDDQN (jaxsal_agents.train_dqn: dueling head,
target network, Double-DQN target, uniform replay) on MinAtar Breakout with the trail channel
dropped and a 4-frame host stack (the env of the PQN MinAtar study). The bugs are replay bugs in
the sampled transitions (jaxsal_agents.train_dqn.corrupt_batch), each at three severities (the
fraction p of sampled transitions it corrupts), so that a lead of the maps over the returns can
show a dose-response; seeds 200-207 (never used: the PQN studies used 0-5 and 100-107; the pilots 0-3).

The map statistic and the decision rule are the PQN study's (experiments.frame_stack_bug.plan,
experiments.frame_stack_bug.detection_rule); the return statistic is a longer window of the same training returns
(RETURN_WINDOW games), with the PQN study's 20 and other windows reported as a sensitivity table.
"""
from __future__ import annotations

import dataclasses

from experiments.frame_stack_bug.plan import LEARNED_FACTOR, Study

RANDOM_MINATAR_BREAKOUT_RETURN = 0.41   # uniformly random play, this env: 1,002 games, env seeds 0-3 (pilot)

# --- the bugs: jaxsal_agents.train_dqn.TRANSITION_BUGS, each at three severities -------------------
BUGS = ("misassembled", "cross_episode", "done_late", "reward_late", "neighbour_next")
SEVERITIES = (0.1, 0.3, 1.0)            # fraction of sampled transitions corrupted


def variant(bug: str, p: float) -> str:
    """A graded variant's name: "done_late_p0.3" (bug, severity p)."""
    return f"{bug}_p{p:g}"


# --- the return statistic: mean of the last RETURN_WINDOW games finished before the checkpoint --------
RETURN_WINDOW = 100
RETURN_WINDOWS_SENSITIVITY = (20, 50, 100, 200, 400)   # every window judged by the same rule, descriptive

# --- the lead of the maps over the returns (the secondary registration's S1 test, on this study) -------
LEAD_ALPHA = 0.05                       # one test: exact one-sided sign-flip over the 8 seeds (p >= 1/256);
                                        # tau, steps and "never" as frame_stack_secondary_plan's S1 (0.95 quantile)


@dataclasses.dataclass(frozen=True)
class ReplayStudy(Study):
    """A frame-stack study trained by the replay DDDQN. Of Study's fields, `lr`, `target_every`
    (updates between target syncs), `num_envs` and `rollout` (one update = num_envs x rollout env
    steps) mean what they mean for jaxsal_agents.train_dqn.DQNConfig; `epochs` and `minibatches`
    are PQN's and unused (0)."""
    buffer_size: int             # replay capacity (transitions)
    batch_size: int              # transitions per gradient step, drawn uniformly with replacement
    grad_steps: int              # gradient steps per update
    learning_starts: int         # env steps stored before the first gradient step
    eps_decay_frac: float        # epsilon 1 -> 0.01 linearly over this fraction of the budget
    random_return: float         # random-play return of the env (the learning check's unit)
    predicted: tuple             # ((bug, "+" | "-" | None), ...): registered map-statistic directions
    preregistration: str
    return_window: int = RETURN_WINDOW
    return_windows: tuple = RETURN_WINDOWS_SENSITIVITY
    lead_alpha: float = LEAD_ALPHA  # the registered lead test (frame_stack_lead.lead_test)
    ckpt_every: int = 128        # updates between orbax checkpoints (resumption only; not analysed)
    trainer: str = "dqn"

    learning_check_registered = True   # class constant, not a field: this study registers the check

    @property
    def predicted_saliency_direction(self) -> dict:
        return dict(self.predicted)

    @property
    def learned_threshold(self) -> float:
        return LEARNED_FACTOR * self.random_return

    @property
    def signals(self) -> dict:
        """The two families: the PQN study's map statistic, and the mean of the last
        `return_window` training games."""
        return {"saliency": "stack_age_gain", "return": f"return_mean_{self.return_window}"}

    @property
    def descriptive_signals(self) -> dict:
        """The sensitivity table: the same rule on the other return windows (never a detection of the study)."""
        return {f"return_{w}": f"return_mean_{w}" for w in self.return_windows if w != self.return_window}


REPLAY_DDDQN = ReplayStudy(
    name="replay_dddqn", game="minatar-breakout",
    variants=("correct",) + tuple(variant(b, p) for b in BUGS for p in SEVERITIES),
    seeds=tuple(range(200, 208)), steps=98_304, num_envs=16, rollout=8, lr=1e-3, epochs=0, minibatches=0,
    arch="minatar_dueling", target_every=8, frames=4, drop_trail=True, snapshot_every=16, checkpoint_every=32,
    buffer_size=50_000, batch_size=64, grad_steps=4, learning_starts=2_048, eps_decay_frac=0.1,
    random_return=RANDOM_MINATAR_BREAKOUT_RETURN,
    predicted=tuple((variant(b, p), None) for b in BUGS for p in SEVERITIES),
    preregistration="experiments/frame_stack_bug/replay_dddqn_preregistration.md")

STUDIES = {REPLAY_DDDQN.name: REPLAY_DDDQN}
