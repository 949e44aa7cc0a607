"""The frozen numbers of the Atari frame-stack study's secondary analyses
(experiments/frame_stack_bug/secondary_registration.md, committed with this module). Do not edit:
a changed analysis is a new registration. Everything else (seeds, checkpoints, probes) is the
primary plan's (experiments.frame_stack_bug.plan.ATARI)."""
from __future__ import annotations

# --- S1: paired per-seed lead of the maps over the returns -------------------------------
S1_SIGNALS = {"maps": "stack_age_gain", "return": "return_mean"}
S1_NULL_QUANTILE = 0.95        # tau: quantile of |correct_s - correct_s'| over seed pairs x checkpoints
S1_QUANTILE_METHOD = "linear"
S1_ALPHA = 0.05                # one test per study: one-sided exact sign-flip over seeds of the mean lead
S1_ALTERNATIVE = "greater"     # lead = return step - map step > 0: the maps flag the bug first
S1_POST_HOC_STUDIES = ("minatar",)   # reported beside it, never as a test (data seen before registration)

# --- S2: the primary rule on a CAM-family statistic ----------------------------------------
CAM_METHODS = ("gradcam", "g1gradcam")
S2_STATISTIC = "cam_row_gain"  # share of |CAM| on the ball-and-paddle rows, gain over the first snapshot
S2_WINDOW = 4                  # the primary window (causal trailing mean over snapshots)
S2_ROWS_FROM = "correct"       # rows from the correct variant's probe stack, newest slot
S2_FAMILY_ALPHA = 0.05         # Bonferroni over the study's two bugs, as the primary rule

# --- S3: Paper A's claim 3 over all runs ---------------------------------------------------
S3_RISE_RETURN = 2 * 1.7       # the primary learning level
PADDLE_FIRST_ROW = 74          # 84x84 Breakout: paddle drawn on rows 75-77 (ball_paddle_rows widens by 1)
S3_OBJECTS = ("ball", "paddle")
S3_FAMILY_ALPHA = 0.05         # Holm over methods x objects (4 tests)
S3_BOOTSTRAP = {"n_boot": 1000, "seed": 0, "level": 0.95}

# --- the four runs trained before this registration (CAM maps lost; re-trained) ----------
RETRAINED = ("correct_s100", "reuse_s100", "reversed_s100", "correct_s101")
REPRODUCE_SHARES_ATOL = 1e-5   # a re-run is the same run when its frame shares agree this closely
