"""Paper A's claims about the saliency methods themselves, measured (issue 17, item 3).

    python -m experiments.paper_a.claims --agent breakout-dddqn --out experiments/results/paper_a_claims
    python -m experiments.paper_a.claims --agent breakout-dddqn --run-dir RUN --out OUT   # + snapshots

Four measurements, each against a reference that says what "no effect" looks like:

1. Edges. "Negative Guided Backprop gradients look like a Laplacian of the frame"; "Guided
   Backprop is not a mere edge detector". Per probe state and stacked frame, the Pearson
   correlation of the negative GBP part max(-g, 0) with |Laplacian(frame)|, of the signed GBP
   map with the signed Laplacian, and of |GBP| with the Sobel edge magnitude; averaged over
   the frames of a state. The same for random-init networks of the same architecture
   (`--random-inits` seeds): if a random network's GBP correlates as much with edges, the edge
   look comes from the architecture (ReLU + guided rule), not from what the agent learned.
2. Action-discriminativeness. "No method is action-discriminative": per method, how much the
   map changes when the explained action changes (Q of action a vs action b, same state) against
   how much it changes between two different states (same rule for the explained action: the
   greedy one). Distance = 1 - Spearman rank correlation of the two maps. A ratio near 0 means
   the map ignores the action; near 1, the action matters as much as the state does.
3. Where CAMs look. For G1Grad-CAM and Grad-CAM: the share of |attribution| on the ball and the
   paddle (jaxsal.metrics.object_attribution on RAM boxes when the probes come from ale-py) or,
   without boxes, on the ball-and-paddle rows (`ball_paddle_rows`), next to the chance level
   (the area share); at a run's snapshots (`--run-dir`), split at the step where the return
   rises (`rise_step`: first step at which the mean of the last 20 games reaches 2 x the
   random-policy 1.7, the study's "learned" level).
4. Split-attention agent (Paper A's Fig.): Guided Backprop per stream and per input frame
   (the stack's T frames are the agent's time steps): the value stream (target = V), the
   advantage stream (A of the greedy action) and Q; per-frame shares and the streams'
   temporal attention weights.

Only jaxsal's public API (jaxsal.explain, jaxsal.metrics) computes maps and scores.
"""
from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import numpy as np
from scipy import ndimage

import jaxsal
from experiments.common.breakout import ball_paddle_rows

RISE_RETURN = 2 * 1.7          # the pre-registration's "learned" level (random Breakout 1.7)
CAM_METHODS = ("g1gradcam", "gradcam")
DISCRIM_METHODS = ("gradient", "grad_x_input", "guided_backprop", "gradcam", "g1gradcam", "g2gradcam")


# ---------------------------------------------------------------- 1. edges
def laplacian(frames) -> np.ndarray:
    """Per-frame Laplacian of (N, H, W, T) frames (spatial only, frames and states separate)."""
    f = np.asarray(frames, np.float64)
    return np.stack([np.stack([ndimage.laplace(f[n, :, :, t]) for t in range(f.shape[-1])], -1)
                     for n in range(f.shape[0])])


def sobel_magnitude(frames) -> np.ndarray:
    """Per-frame Sobel gradient magnitude of (N, H, W, T) frames."""
    f = np.asarray(frames, np.float64)

    def mag(img):   # 2-D only: ndimage.sobel on the 4-D array would smooth across states and frames
        return np.hypot(ndimage.sobel(img, axis=0, mode="nearest"), ndimage.sobel(img, axis=1, mode="nearest"))
    return np.stack([np.stack([mag(f[n, :, :, t]) for t in range(f.shape[-1])], -1) for n in range(f.shape[0])])


def pearson_maps(a, b) -> np.ndarray:
    """Pearson correlation over pixels, per state and frame: (N, H, W, T) x2 -> (N, T); NaN where
    either map is constant."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    a = a - a.mean(axis=(1, 2), keepdims=True)
    b = b - b.mean(axis=(1, 2), keepdims=True)
    den = np.sqrt((a * a).sum(axis=(1, 2)) * (b * b).sum(axis=(1, 2)))
    num = (a * b).sum(axis=(1, 2))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def edge_correlations(gbp, obs) -> dict:
    """Per-state correlations (mean over the state's frames, constant maps skipped) of per-frame
    Guided Backprop maps `gbp` (N, H, W, T) with the frames `obs` (N, H, W, T)."""
    lap, sob = laplacian(obs), sobel_magnitude(obs)
    g = np.asarray(gbp, np.float64)
    pairs = {"neg_gbp_vs_abs_laplacian": (np.maximum(-g, 0), np.abs(lap)),
             "gbp_vs_laplacian": (g, lap),
             "abs_gbp_vs_sobel": (np.abs(g), sob)}
    out = {}
    for k, (x, y) in pairs.items():
        r = pearson_maps(x, y)
        with warnings.catch_warnings():        # a state whose maps are all constant -> NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            out[k] = np.nanmean(r, axis=1)
    return out


def mean_ci(x, n_boot: int = 1000, seed: int = 0) -> dict:
    """Mean over states with a 95 % bootstrap percentile interval (NaN states dropped)."""
    x = np.asarray(x, float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {"mean": None, "ci95": [None, None], "n": 0}
    rng = np.random.default_rng(seed)
    boots = x[rng.integers(0, x.size, (n_boot, x.size))].mean(1)
    lo, hi = np.quantile(boots, [0.025, 0.975])
    return {"mean": float(x.mean()), "ci95": [float(lo), float(hi)], "n": int(x.size)}


def edge_claims(apply_fn, trained, random_params: list, obs) -> dict:
    """Claim 1 for a trained network vs random-init networks of the same architecture."""
    def corr(params):
        gbp = jaxsal.explain(apply_fn, params, obs, method="guided_backprop", per_frame=True)
        return edge_correlations(np.asarray(gbp), obs)

    t = corr(trained)
    rs = [corr(p) for p in random_params]
    out = {}
    for k in t:
        r = np.nanmean(np.stack([x[k] for x in rs]), 0) if rs else None   # per state, mean over inits
        out[k] = {"trained": mean_ci(t[k]), "random_init": mean_ci(r) if r is not None else None,
                  "trained_minus_random": mean_ci(t[k] - r) if r is not None else None}
    return out


# ---------------------------------------------------------------- 2. action-discriminativeness
def spearman_maps(a, b) -> np.ndarray:
    """Spearman rank correlation over pixels per state: (N, ...) x2 -> (N,) (average ranks for ties)."""
    from scipy.stats import rankdata

    a = np.asarray(a, np.float64).reshape(len(a), -1)
    b = np.asarray(b, np.float64).reshape(len(b), -1)
    ra, rb = rankdata(a, axis=1), rankdata(b, axis=1)
    ra -= ra.mean(1, keepdims=True)
    rb -= rb.mean(1, keepdims=True)
    den = np.sqrt((ra * ra).sum(1) * (rb * rb).sum(1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (ra * rb).sum(1) / np.where(den > 0, den, 1.0), np.nan)


def discriminativeness_from_maps(by_action, chosen_maps) -> dict:
    """`by_action` (A, N, H, W) maps of each action, `chosen_maps` (N, H, W) of the greedy
    action -> per-state action change (mean 1 - Spearman over action pairs), state change
    (1 - Spearman between consecutive states' greedy maps) and their ratio."""
    a = np.asarray(by_action)
    n_act = a.shape[0]
    pairs = [(i, j) for i in range(n_act) for j in range(i + 1, n_act)]
    act = np.nanmean(np.stack([1 - spearman_maps(a[i], a[j]) for i, j in pairs]), 0)
    c = np.asarray(chosen_maps)
    state = 1 - spearman_maps(c[:-1], c[1:])
    return {"action_change": mean_ci(act), "state_change": mean_ci(state),
            "ratio": float(np.nanmean(act) / np.nanmean(state)) if np.nanmean(state) > 0 else None}


def action_discriminativeness(apply_fn, params, obs, num_actions: int, methods=DISCRIM_METHODS) -> dict:
    """Claim 2 per method (maps via jaxsal.explain with target q_action for every action)."""
    n = len(obs)
    by_action = [jaxsal.explain(apply_fn, params, obs, method=list(methods), target="q_action",
                                actions=np.full(n, a, np.int32)) for a in range(num_actions)]
    chosen = jaxsal.explain(apply_fn, params, obs, method=list(methods))
    return {m: discriminativeness_from_maps(np.stack([np.asarray(b[m]) for b in by_action]),
                                            np.asarray(chosen[m])) for m in methods}


# ---------------------------------------------------------------- 3. where CAMs look
def row_share(maps, rows) -> tuple[np.ndarray, np.ndarray]:
    """Per state: share of |map| on the marked rows, and the chance share (rows / height)."""
    m = np.abs(np.asarray(maps, np.float64))
    m = m.sum(-1) if m.ndim == 4 else m
    per_row = m.sum(2)
    tot = per_row.sum(1)
    share = np.where(tot > 0, (per_row * rows).sum(1) / np.where(tot > 0, tot, 1.0), np.nan)
    return share, rows.mean(1)


def cam_look(maps: dict, obs, boxes=None) -> dict:
    """Claim 3 on one set of maps {method: (N, H, W)}: object shares (with boxes) or row shares."""
    out = {}
    for m, v in maps.items():
        if boxes is not None:
            res = jaxsal.metrics.object_attribution(np.asarray(v), boxes)
            out[m] = {c: {"share": s["absolute"], "chance": s["chance"]} for c, s in res.mean().items()}
        else:
            share, chance = row_share(v, ball_paddle_rows(obs))
            out[m] = {"ball_paddle_rows": {"share": mean_ci(share), "chance": float(np.mean(chance))}}
    return out


def rise_step(steps, returns, level: float = RISE_RETURN, games: int = 20):
    """First env step at which the mean of the last `games` full-game returns reaches `level`."""
    r = np.asarray(returns, float)
    for i in range(len(r)):
        if i + 1 >= min(games, len(r)) and r[max(0, i + 1 - games):i + 1].mean() >= level:
            return int(steps[i])
    return None


def snapshot_look(run_dir) -> dict:
    """Claim 3 over a training run's snapshots: per snapshot, CAM shares on the ball/paddle rows
    and, when the probes have RAM boxes (snapshots/probe_objects.npz), on each object, each
    marked before/after the return rises."""
    from jaxsal.game_objects import ObjectBoxes
    from jaxsal_agents.snapshots import load_snapshots, read_returns

    run_dir = Path(run_dir)
    probe = np.load(run_dir / "snapshots" / "probe.npy", allow_pickle=False)
    steps, rets = read_returns(run_dir / "returns.csv") if (run_dir / "returns.csv").exists() else ([], [])
    rise = rise_step(steps, rets) if len(rets) else None
    rows = ball_paddle_rows(probe)
    boxes_file = run_dir / "snapshots" / "probe_objects.npz"
    boxes = ObjectBoxes.load(boxes_file) if boxes_file.exists() else None
    table = []
    for step, arr in load_snapshots(run_dir / "snapshots"):
        for m in CAM_METHODS:
            if m in arr:
                share, chance = row_share(arr[m], rows)
                row = {"step": step, "method": m, "before_rise": rise is None or step < rise,
                       "share": float(np.nanmean(share)), "chance": float(chance.mean())}
                if boxes is not None:
                    row["objects"] = cam_look({m: arr[m]}, probe, boxes)[m]
                table.append(row)
    return {"rise_step": rise, "rise_level": RISE_RETURN, "snapshots": table}


# ---------------------------------------------------------------- 4. split attention
def split_attention_streams(apply_fn, params, obs) -> dict:
    """Guided Backprop per stream (Q, value, advantage of the greedy action) and per input frame,
    with per-frame shares and the streams' mean temporal attention."""
    import jax.numpy as jnp

    from jaxsal.metrics import frame_shares

    out = apply_fn(params, obs)

    def advantage_of_greedy(o):   # from the output itself: jaxsal also calls targets on sub-batches
        return jnp.take_along_axis(o["advantage"], jnp.argmax(o["q"], -1)[:, None], -1)[:, 0]
    targets = {"q": "q_chosen", "value": lambda o: o["value"], "advantage": advantage_of_greedy}
    res = {}
    for name, tg in targets.items():
        g = np.asarray(jaxsal.explain(apply_fn, params, obs, method="guided_backprop", per_frame=True, target=tg))
        sh = frame_shares(g, g.shape[-1])
        res[name] = {"maps": g, "frame_shares": sh.mean(0).tolist()}
    res["value_attention"] = np.asarray(out["value_attention"]).mean(0).tolist()
    res["advantage_attention"] = np.asarray(out["advantage_attention"]).mean(0).tolist()
    return res


def split_attention_claim(a, out: Path) -> dict:
    """Claim 4 on the shipped agent `a.split_attention_agent` (trained, with a random init of the same
    network beside it) or, without one, on a random-init agent of `a.split_attention_frames` frames."""
    from jaxsal_agents.framestack import make_stacked_env
    from jaxsal_agents.networks import SplitAttentionDQN
    from jaxsal_agents.snapshots import probe_states
    from jaxsal_agents.zoo import load

    if a.split_attention_agent:
        agent = load(a.split_attention_agent)
        model, frames = agent.model, int(agent.card["obs_shape"][-1])
    else:
        agent, frames = None, a.split_attention_frames
        model = None
    env = make_stacked_env("breakout", 8, train=False, seed=10_000, num_frames=frames)
    sobs = probe_states(env, min(8, a.probes), seed=0).astype(np.float32)
    model = model or SplitAttentionDQN(env.num_actions, frames=frames, lstm_features=a.split_attention_lstm)
    rand = random_inits(model, sobs, [0])[0]

    def summary(streams):
        return {k: (v if not isinstance(v, dict) else {"frame_shares": v["frame_shares"]}) for k, v in streams.items()}
    random_streams = split_attention_streams(model.apply, rand, sobs)
    if agent is None:
        figure_streams(random_streams, sobs, out / "split_attention_streams.png")
        return {"params": "random init (seed 0)", **summary(random_streams)}
    trained = split_attention_streams(agent.model.apply, agent.params, sobs)
    figure_streams(trained, sobs, out / "split_attention_streams.png")
    figure_streams(random_streams, sobs, out / "split_attention_streams_random_init.png")
    return {"params": f"shipped `{a.split_attention_agent}` ({agent.card.get('algorithm', '')}; "
                      f"return {agent.card['eval']['mean_return']:.1f})",
            "agent": a.split_attention_agent, "agent_return": agent.card["eval"]["mean_return"],
            "probes": int(len(sobs)), "trained": summary(trained), "random_init": summary(random_streams)}


# ---------------------------------------------------------------- CLI
def random_inits(model, obs, seeds):
    import jax
    import jax.numpy as jnp

    return [model.init(jax.random.PRNGKey(int(s)), jnp.zeros((1,) + obs.shape[1:], jnp.float32)) for s in seeds]


def committed_setup(agent_name: str, committed: dict):
    """(agent, obs float32, random-init params) of a committed claims.json: its probes (ale-py, seed 10,000)
    and its random inits (seeds 1..random_inits), for the re-analyses that recompute per-state values."""
    from jaxsal_agents.snapshots import probe_states_with_objects
    from jaxsal_agents.zoo import load

    agent = load(agent_name)
    obs, _ = probe_states_with_objects(agent.card["game"], committed["probes"], seed=10_000)
    obs = obs.astype(np.float32)
    return agent, obs, random_inits(agent.model, obs, range(1, 1 + committed["random_inits"]))


def figure_streams(streams, obs, path, state: int = 0):
    """Frames on top, one row of Guided Backprop maps per stream (white = 0; the colour scale is the
    99.5th percentile of |map| over the state's frames, so sparse ball and paddle marks show);
    each map's title: the frame's share of |map| and, for the streams, its attention weight."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ("q", "value", "advantage")
    t = obs.shape[-1]
    fig, axes = plt.subplots(len(names) + 1, t, figsize=(1.3 * t, 1.5 * (len(names) + 1)))
    for k in range(t):
        axes[0, k].imshow(obs[state, :, :, k], cmap="gray")
        axes[0, k].set_title(f"frame {k}" + (" (newest)" if k == t - 1 else ""), fontsize=6)
        for r, n in enumerate(names):
            maps = streams[n]["maps"][state]
            lim = float(np.percentile(np.abs(maps), 99.5)) or float(np.abs(maps).max()) or 1.0
            axes[r + 1, k].imshow(maps[:, :, k], cmap="PiYG", vmin=-lim, vmax=lim)
            att = streams.get(f"{n}_attention")
            label = f"share {streams[n]['frame_shares'][k]:.2f}" + (f", att {att[k]:.2f}" if att else "")
            axes[r + 1, k].set_title(label, fontsize=5)
            if k == 0:
                axes[r + 1, k].set_ylabel(n, fontsize=7)
    for a in axes.ravel():
        a.set_xticks([])
        a.set_yticks([])
    fig.suptitle("split-attention agent: Guided Backprop per stream and frame (green +, pink -; "
                 "share of |map|, mean attention weight)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None, log=lambda m: print(m, flush=True)):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agent", default="breakout-dddqn", help="shipped agent name or card .json")
    p.add_argument("--probes", type=int, default=64)
    p.add_argument("--random-inits", type=int, default=3, help="random-init networks to compare with")
    p.add_argument("--run-dir", action="append", default=[], help="training run(s) with snapshots (claim 3)")
    p.add_argument("--split-attention-frames", type=int, default=10,
                   help="claim 4 on a random-init split-attention agent of this many frames (0: skip)")
    p.add_argument("--split-attention-lstm", type=int, default=512)
    p.add_argument("--split-attention-agent", default="",
                   help="claim 4 on this shipped split-attention agent (e.g. breakout-split-attention), "
                        "beside a random-init network of the same shape")
    p.add_argument("--only-split-attention", action="store_true",
                   help="compute claim 4 only and update it in OUT/claims.json, keeping claims 1-3")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    from jaxsal_agents.snapshots import probe_states_with_objects
    from jaxsal_agents.zoo import load

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.only_split_attention:
        res = json.loads((out / "claims.json").read_text()) if (out / "claims.json").exists() else {}
        res["split_attention"] = split_attention_claim(a, out)
        (out / "claims.json").write_text(json.dumps(res, indent=1, default=float))
        log(f"updated claim 4 in {out / 'claims.json'}")
        return res
    agent = load(a.agent)
    obs, boxes = probe_states_with_objects(agent.card["game"], a.probes, seed=10_000)
    obs = obs.astype(np.float32)
    rand = random_inits(agent.model, obs, range(1, 1 + a.random_inits))
    res = {"agent": a.agent, "probes": int(len(obs)), "random_inits": a.random_inits,
           "edges": edge_claims(agent.model.apply, agent.params, rand, obs)}
    log("edges: " + json.dumps({k: v["trained"]["mean"] for k, v in res["edges"].items()}))
    res["action_discriminativeness"] = {
        "trained": action_discriminativeness(agent.model.apply, agent.params, obs, agent.card["num_actions"]),
        "random_init": action_discriminativeness(agent.model.apply, rand[0], obs, agent.card["num_actions"])}
    log("action/state change ratio: " + json.dumps(
        {m: v["ratio"] for m, v in res["action_discriminativeness"]["trained"].items()}))
    cams = jaxsal.explain(agent.model.apply, agent.params, obs, method=list(CAM_METHODS))
    cams_r = jaxsal.explain(agent.model.apply, rand[0], obs, method=list(CAM_METHODS))
    res["cam_look"] = {"trained": {"objects": cam_look(cams, obs, boxes), "rows": cam_look(cams, obs)},
                       "random_init": {"objects": cam_look(cams_r, obs, boxes), "rows": cam_look(cams_r, obs)}}
    res["snapshots"] = {d: snapshot_look(d) for d in a.run_dir}
    if a.split_attention_frames or a.split_attention_agent:
        res["split_attention"] = split_attention_claim(a, out)
    (out / "claims.json").write_text(json.dumps(res, indent=1, default=float))
    log(f"wrote {out / 'claims.json'}")
    return res


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
