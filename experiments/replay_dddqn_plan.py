"""The plan of the pre-registered replay-DDDQN frame-stack study (issue 32 item 4): the one source
of truth for its seeds, variants, budget, trainer settings, snapshot and checkpoint schedules and
the rule's level. experiments/replay_dddqn_preregistration.md describes and cites it;
experiments.frame_stack_study runs and analyses it (`--study replay_dddqn`). Do not edit after the
commit that freezes the pre-registration (its status line): a changed plan is then a new study
(new seeds, new file).

Paper A's own setting on MinAtar: a replay-buffer DDDQN (jaxsal_agents.train_dqn: dueling head,
target network, Double-DQN target, uniform replay) on MinAtar Breakout with the trail channel
dropped and a 4-frame host stack (the env of the PQN MinAtar study), the correct stack, the four
frame-stack bugs of jaxsal_agents.framestack and the replay-specific `misassembled` transition bug;
seeds 200-207 (never used before: the PQN studies used 0-5 and 100-107; this study's pilot 0-3).

The map statistic, the return statistic, the decision rule and its family-wise level are the PQN
study's, imported from experiments.frame_stack_plan (unchanged; this module adds none).
"""
from __future__ import annotations

import dataclasses

from experiments.frame_stack_plan import LEARNED_FACTOR, Study

RANDOM_MINATAR_BREAKOUT_RETURN = 0.41   # uniformly random play, this env: 1,002 games, env seeds 0-3 (pilot)


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
    ckpt_every: int = 128        # updates between orbax checkpoints (resumption only; not analysed)
    trainer: str = "dqn"

    learning_check_registered = True   # class constant, not a field: this study registers the check

    @property
    def predicted_saliency_direction(self) -> dict:
        return dict(self.predicted)

    @property
    def learned_threshold(self) -> float:
        return LEARNED_FACTOR * self.random_return


REPLAY_DDDQN = ReplayStudy(
    name="replay_dddqn", game="minatar-breakout",
    variants=("correct", "reuse", "no_update", "reversed", "misaligned", "misassembled"),
    seeds=tuple(range(200, 208)), steps=98_304, num_envs=16, rollout=8, lr=1e-3, epochs=0, minibatches=0,
    arch="minatar_dueling", target_every=8, frames=4, drop_trail=True, snapshot_every=16, checkpoint_every=32,
    buffer_size=50_000, batch_size=64, grad_steps=4, learning_starts=2_048, eps_decay_frac=0.1,
    random_return=RANDOM_MINATAR_BREAKOUT_RETURN,
    predicted=(("reuse", "-"), ("no_update", "+"), ("reversed", "+"), ("misaligned", None),
               ("misassembled", None)),
    preregistration="experiments/replay_dddqn_preregistration.md")

STUDIES = {REPLAY_DDDQN.name: REPLAY_DDDQN}
