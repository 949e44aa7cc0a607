"""The S1 lead procedure (frame-stack secondary registration) and the replay-DDDQN study's registered
lead test built on it: per seed the first checkpoint from which each signal stays beyond the correct
runs' null spread, the lead of maps over returns, and an exact sign-flip test over seeds. Its own
module so that the primary study's summary and the secondary analyses both use it without importing
each other."""
from __future__ import annotations

import itertools

import numpy as np

from experiments.frame_stack_bug import secondary_plan as sp
from experiments.frame_stack_bug.stats import at_checkpoints, t_interval


def sign_flip_p(x, alternative: str = "greater") -> float:
    """Exact sign-flip permutation p of mean(x) over all 2^n sign assignments (one-sided
    "greater" / "less", or "two-sided"); ties count as at least as extreme."""
    x = np.asarray(x, np.float64)
    if x.ndim != 1 or x.size < 1:
        raise ValueError(f"need a 1-d array of per-unit values, got shape {x.shape}")
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=x.size)))
    means = signs @ x / x.size
    obs, tol = x.mean(), 1e-12 * max(1.0, float(np.abs(x).max()))
    if alternative == "greater":
        return float((means >= obs - tol).mean())
    if alternative == "less":
        return float((means <= obs + tol).mean())
    if alternative == "two-sided":
        return float((np.abs(means) >= abs(obs) - tol).mean())
    raise ValueError(f"alternative must be greater, less or two-sided, got {alternative!r}")


def null_threshold(correct) -> float:
    """tau: the S1_NULL_QUANTILE of |correct_s - correct_s'| over seed pairs s < s' and checkpoints."""
    c = np.asarray(correct, np.float64)
    d = [np.abs(c[i] - c[j]) for i, j in itertools.combinations(range(c.shape[0]), 2)]
    return float(np.quantile(np.concatenate(d), sp.S1_NULL_QUANTILE, method=sp.S1_QUANTILE_METHOD))


def per_seed_step(steps, diff, tau: float, never: int):
    """First checkpoint from which sign(D[last]) * D > tau at it and every later one; `never` if none."""
    d = np.asarray(diff, np.float64)
    if abs(d[-1]) <= tau:
        return never
    ok = np.sign(d[-1]) * d > tau
    t = len(d)
    while t > 0 and ok[t - 1]:
        t -= 1
    return int(steps[t])


def s1_lead(study, runs: dict, checkpoints, signals=None) -> dict:
    """S1 on `runs` {(variant, seed): rows}: per-seed detection steps of both signals and the lead
    (return step - map step), with the one-sided sign-flip test over seeds of the bugs' mean lead.
    `signals` {"maps": key, "return": key}: the registered S1_SIGNALS unless another study registers its own."""
    signals = sp.S1_SIGNALS if signals is None else signals
    never = int(checkpoints[-1] + (checkpoints[1] - checkpoints[0]))

    def matrix(v, key):
        return np.stack([at_checkpoints(runs[(v, s)], checkpoints, key) for s in study.seeds])

    tau = {name: null_threshold(matrix("correct", key)) for name, key in signals.items()}
    per_bug, leads = {}, []
    for bug in study.bugs:
        steps = {name: [per_seed_step(checkpoints, d, tau[name], never)
                        for d in matrix(bug, key) - matrix("correct", key)]
                 for name, key in signals.items()}
        lead = np.array(steps["return"], float) - np.array(steps["maps"], float)
        leads.append(lead)
        m, _, lo, hi = t_interval(lead)
        per_bug[bug] = {"map_steps": steps["maps"], "return_steps": steps["return"], "lead": lead.tolist(),
                        "mean_lead": m, "t95": [lo, hi], "share_maps_first": float((lead > 0).mean()),
                        "p_descriptive": sign_flip_p(lead, sp.S1_ALTERNATIVE)}
    per_seed = np.mean(leads, 0)
    p = sign_flip_p(per_seed, sp.S1_ALTERNATIVE)
    return {"label": "secondary", "tau": tau, "never_step": never, "seeds": list(study.seeds), "bugs": per_bug,
            "per_seed_mean_lead": per_seed.tolist(), "p": p, "alpha": sp.S1_ALPHA,
            "min_attainable_p": 1 / 2 ** len(study.seeds), "can_reject": bool(1 / 2 ** len(study.seeds) <= sp.S1_ALPHA),
            "maps_first": bool(p <= sp.S1_ALPHA)}


def lead_test(study, runs: dict, checkpoints) -> dict:
    """A study's registered lead test (the replay-DDDQN study): the secondary registration's S1
    procedure on the study's own two signals: per seed and bug the first checkpoint from which the
    paired difference stays beyond the correct runs' null spread tau, the lead = return step - map
    step, and an exact one-sided sign-flip test over seeds of the per-seed mean lead at `lead_alpha`;
    with the mean lead per bug (per severity: the dose-response, descriptive)."""
    sig = study.signals
    out = s1_lead(study, runs, checkpoints, signals={"maps": sig["saliency"], "return": sig["return"]})
    return dict(out, label="registered lead test", alpha=study.lead_alpha,
                can_reject=bool(out["min_attainable_p"] <= study.lead_alpha),
                maps_first=bool(out["p"] <= study.lead_alpha))
