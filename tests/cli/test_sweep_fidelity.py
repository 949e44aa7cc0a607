"""`jaxsal sweep`'s insertion/deletion AUCs follow the sweep's target and actions: equal to a hand
computation from the definition for Q (greedy and buffer actions), value and policy targets, on a
CleanRL-PPO-style actor-critic (trunk, actor and critic parameter trees; (logits, value) out)."""
import numpy as np
import pytest

import jaxsal
from jaxsal.cli import main
from tests._support.cli_support import frames

N = 4
AGENTS = '''
import flax.linen as nn
import jax
import jax.numpy as jnp


class Network(nn.Module):   # cleanrl ppo_atari_envpool_xla_jax.py's layout, small: trunk, actor, critic
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(8, (3, 3), (2, 2), padding="VALID")(x / 255.0))
        return nn.relu(nn.Dense(16)(x.reshape((x.shape[0], -1))))


class Head(nn.Module):
    size: int

    @nn.compact
    def __call__(self, h):
        return nn.Dense(self.size)(h)


def _parts():
    net, actor, critic = Network(), Head(3), Head(1)
    k = jax.random.split(jax.random.PRNGKey(0), 3)
    h = jnp.zeros((1, 16))
    params = {"network": net.init(k[0], jnp.zeros((1, 10, 10, 4))), "actor": actor.init(k[1], h),
              "critic": critic.init(k[2], h)}
    return net, actor, critic, params


def ppo():
    """(logits, value), the value offset so that V > 0 (a rewarded game's critic)."""
    net, actor, critic, params = _parts()

    def apply_fn(p, x):
        h = net.apply(p["network"], x)
        return actor.apply(p["actor"], h), critic.apply(p["critic"], h)[:, 0] + 3.0
    return apply_fn, params


def ppo_dict():
    """The layout jaxsal's CleanRL PPO loader gives: {"logits", "value"}."""
    apply_fn, params = ppo()
    return (lambda p, x: dict(zip(("logits", "value"), apply_fn(p, x)))), params


def qnet():
    """Q-values (N, 3), offset so that Q > 0."""
    net, actor, _, params = _parts()
    return (lambda p, x: actor.apply(p["actor"], net.apply(p["network"], x)) + 2.0), params
'''


def _hand_curve(f, x, m, k, mode):
    """f(x_t) for t = 0..ceil(H*W/k), from the definition: the t*k most salient pixels (stable order)
    inserted into black (insertion) or removed to black (deletion), all four frames of a pixel at once."""
    order = np.argsort(-m.ravel(), kind="stable")
    curve = []
    for t in range(-(-m.size // k) + 1):
        top = np.zeros(m.size, bool)
        top[order[:t * k]] = True
        top = top.reshape(m.shape)[..., None]
        xt = np.where(top, x, 0) if mode == "insertion" else np.where(top, 0, x)
        curve.append(f(xt[None].astype(np.float32)))
    return np.array(curve, np.float64)


def _hand_aucs(apply_fn, params, obs, maps, target, buffer_actions, mode):
    """Per frame AUC of the score jaxsal.metrics picks for the target: Q_a(x_t)/Q_a(x) (a = argmax Q(x),
    or the buffer's action for q_action), V(x_t)/V(x), pi(a|x_t) (a = argmax logits(x), also for q_chosen
    on a policy's {"logits", "value"}); NaN where the ratio is undefined (clean score <= 0 or beyond 100)."""
    if isinstance(apply_fn(params, obs[:1].astype(np.float32)), dict):   # a policy: as its (logits, value)
        as_dict, target = apply_fn, "log_prob"
        apply_fn = lambda p, o: (as_dict(p, o)["logits"], as_dict(p, o)["value"])
    out = []
    for i, (x, m) in enumerate(zip(obs, maps)):
        clean = apply_fn(params, x[None].astype(np.float32))
        if target in ("q_chosen", "q_action"):
            a = int(np.argmax(clean[0])) if target == "q_chosen" else int(buffer_actions[i])
            f = lambda o: float(apply_fn(params, o)[0, a])
        elif target == "value":
            f = lambda o: float(apply_fn(params, o)[1][0])
        else:
            a = int(np.argmax(clean[0][0]))
            f = lambda o: float(np.exp(np.asarray(apply_fn(params, o)[0][0], np.float64))[a]
                                / np.exp(np.asarray(apply_fn(params, o)[0][0], np.float64)).sum())
        c = _hand_curve(f, x, m, 84, mode)
        if target in ("q_chosen", "q_action", "value"):
            clean_f = c[-1] if mode == "insertion" else c[0]
            c = c / clean_f if clean_f > 0 and np.all(np.abs(c / clean_f) <= 100) else np.full_like(c, np.nan)
        out.append(c.mean())
    return np.array(out)


@pytest.mark.parametrize("fn, target", [("qnet", "q_chosen"), ("qnet", "q_action"), ("ppo", "value"),
                                        ("ppo", "log_prob"), ("ppo", "policy_logit"),
                                        ("ppo_dict", "q_chosen")])
def test_sweep_insertion_and_deletion_equal_the_hand_computation(tmp_path, fn, target):
    (tmp_path / "agents.py").write_text(AGENTS)
    obs = frames(N, seed=3)
    acts = np.array([2, 0, 1, 2], np.int64)
    np.savez(tmp_path / "buf.npz", obs=obs, actions=acts)
    (tmp_path / "sweep.toml").write_text(f'''
agents = ["{tmp_path / 'agents.py'}:{fn}"]
inputs = ["buf.npz"]
metrics = ["insertion", "deletion"]
target = "{target}"
[methods]
gradient = {{}}
''')
    assert main(["sweep", str(tmp_path / "sweep.toml"), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    t = jaxsal.load_sweep(tmp_path / "out")
    assert list(t["status"]) == ["ok"] and list(t["target"]) == [target]
    import importlib.util

    spec = importlib.util.spec_from_file_location("sweep_agents", tmp_path / "agents.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    apply_fn, params = getattr(mod, fn)()
    job = tmp_path / "out" / "cells" / fn / "default" / "buf" / "gradient" / "job"
    maps = np.asarray(jaxsal.load_maps(job, "gradient"), np.float64)
    if target == "q_action":   # the buffer's actions are not the greedy ones: the old argmax score differs
        assert (np.argmax(np.asarray(apply_fn(params, obs.astype(np.float32))), -1) != acts).any()
    for mode in ("insertion", "deletion"):
        want = _hand_aucs(apply_fn, params, obs, maps, target, acts, mode)
        assert np.isfinite(want).all()
        np.testing.assert_allclose(t[f"{mode}_auc"][0], want.mean(), rtol=1e-4, err_msg=mode)
        assert t[f"{mode}_defined"][0] == 1.0
