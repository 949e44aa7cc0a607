"""The Atari frame-stack study's `fast_conv` deviation, measured: the PQN update with jaxsal's
strided-conv rule (the trainer's default since after the registration) against the plain update,
on the study's own settings (dueling Nature CNN with LayerNorm, Adam at lr 2.5e-4, 16 envs x 32
steps, 2 epochs x 4 minibatches, the Double-DQN target), on real stacked Breakout frames.

    python -m experiments.frame_stack_bug.fastconv_ab --out experiments/results/frame_stack_bug/fastconv_ab.json

From the same state (seed 100's initial weights) both updates run `--updates` times on rollouts of
the correct stack under the epsilon-greedy policy of the plain run, so both see the same data; the
JSON reports per update the loss of each, the largest parameter difference relative to the
largest parameter change of the plain update, and the share of greedy actions that agree on the
rollout's states, and the largest difference of one minibatch's parameter gradient under
the two applies relative to its largest entry (the update's loss with zero targets).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from experiments.frame_stack_bug import plan
from experiments.frame_stack_bug import study as fss


def study_config(study: plan.Study, seed: int, fast: bool):
    from jaxsal_agents.train import PQNConfig
    return PQNConfig(game=study.game, arch=study.arch, steps=study.steps, num_envs=study.num_envs,
                     rollout=study.rollout, lr=study.lr, epochs=study.epochs, minibatches=study.minibatches,
                     target_every=study.target_every, seed=seed, fast_conv=fast)


def rollout(env, act, params, obs, key, eps, t):
    buf = {k: [] for k in ("obs", "actions", "rewards", "dones", "q_max", "greedy")}
    for _ in range(t):
        key, sub = jax.random.split(key)
        actions, q_max, greedy = act(params, obs, sub, eps)
        actions = np.asarray(actions)
        nxt, reward, done, _ = env.step(actions)
        for k, v in zip(buf, (obs, actions, reward, done, q_max, greedy)):
            buf[k].append(v)
        obs = nxt
    return {k: jnp.asarray(np.stack(v)) for k, v in buf.items()}, obs, key


def ab(study: plan.Study = plan.ATARI, seed: int = 100, updates: int = 4, eps: float = 1.0) -> dict:
    from jaxsal.backprop.rules import rewrite
    from jaxsal_agents.train import initial_state, make_act, make_optimizer, make_update, q_values

    env_fn = fss.default_env_fn(study, None)
    env = env_fn(study.game, study.num_envs, train=True, seed=seed)
    model = fss.build_model(study, env)
    cfg = {f: study_config(study, seed, f) for f in (True, False)}
    tx = make_optimizer(cfg[False])
    state = initial_state(cfg[False], model, tx, env.obs_shape)
    upd = {f: make_update(model, tx, cfg[f]) for f in (True, False)}
    act = make_act(model)
    p = {f: state["params"] for f in (True, False)}
    o = {f: state["opt_state"] for f in (True, False)}
    target, key, obs = state["target"], state["key"], env.reset()
    mb = study.steps_per_update // study.minibatches
    fast_apply = rewrite(model.apply, "plain", fast_conv=True)

    def grad_fn(apply):
        def loss(params, x, a):   # a minibatch's squared Q(a) (the update's loss with zero targets)
            q = q_values(apply(params, x))
            return 0.5 * jnp.mean(jnp.take_along_axis(q, a[:, None], -1) ** 2)
        return jax.jit(jax.grad(loss))
    grad = {True: grad_fn(fast_apply), False: grad_fn(model.apply)}
    x0 = jnp.zeros((mb,) + tuple(env.obs_shape), jnp.float32)
    a0 = jnp.zeros((mb,), jnp.int32)
    # evidence that the rule is in the fast gradient: the two traced programs differ
    programs = {f: str(jax.make_jaxpr(grad[f])(state["params"], x0, a0)) for f in (True, False)}
    rows = []
    for u in range(updates):
        batch, obs, key = rollout(env, act, p[False], obs, key, eps, study.rollout)
        key, sub = jax.random.split(key)
        before = p[False]
        loss = {}
        for f in (True, False):
            p[f], o[f], loss[f] = upd[f](p[f], target, o[f], sub, *batch.values(), obs)
        change = max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(p[False]), jax.tree.leaves(before)))
        diff = max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(p[True]), jax.tree.leaves(p[False])))
        x = batch["obs"].reshape((-1,) + batch["obs"].shape[2:])
        q = {f: np.asarray(q_values(model.apply(p[f], x))) for f in (True, False)}
        agree = float((q[True].argmax(-1) == q[False].argmax(-1)).mean())
        g = {f: grad[f](before, x[:mb], batch["actions"].reshape(-1)[:mb]) for f in (True, False)}
        gdiff = max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(g[True]), jax.tree.leaves(g[False])))
        gmax = max(float(jnp.abs(b).max()) for b in jax.tree.leaves(g[False]))
        rows.append({"update": u + 1, "loss_fast": float(loss[True]), "loss_plain": float(loss[False]),
                     "max_param_diff": diff, "max_param_change_plain": change,
                     "relative_diff": diff / change if change else float("nan"), "greedy_agreement": agree,
                     "minibatch_grad_relative_diff": gdiff / gmax})
        if study.target_every and (u + 1) % study.target_every == 0:
            target = p[False]
    return {"study": study.name, "seed": seed, "updates": updates, "epsilon": eps,
            "settings": dataclasses.asdict(cfg[True]) | {"fast_conv": "both"}, "rows": rows,
            "worst_relative_diff": max(r["relative_diff"] for r in rows),
            "min_greedy_agreement": min(r["greedy_agreement"] for r in rows),
            "worst_minibatch_grad_relative_diff": max(r["minibatch_grad_relative_diff"] for r in rows),
            "gradient_programs_differ": programs[True] != programs[False],
            "jax": jax.__version__, "backend": jax.default_backend()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--updates", type=int, default=4)
    ap.add_argument("--seed", type=int, default=100)
    ap.add_argument("--out", default="experiments/results/frame_stack_bug/fastconv_ab.json")
    a = ap.parse_args(argv)
    res = ab(seed=a.seed, updates=a.updates)
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    for r in res["rows"]:
        print(f"update {r['update']}: loss {r['loss_fast']:.6f} vs {r['loss_plain']:.6f}, "
              f"max |dparams| {r['max_param_diff']:.2e} ({r['relative_diff']:.2e} of the update), "
              f"greedy agreement {r['greedy_agreement']:.4f}, "
              f"minibatch gradient diff {r['minibatch_grad_relative_diff']:.2e} of its largest entry")


if __name__ == "__main__":
    main()
