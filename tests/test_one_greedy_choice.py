"""The greedy action is chosen in one place, jaxsal.targets.greedy: a source scan finds no other
action choice (a target's `choose` called, or an argmax over the action axis or over Q-values or
logits), and the metrics that choose an action follow the target's choice."""
import ast
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import jaxsal
from jaxsal.metrics.displacement import displacement_effects
from jaxsal.metrics.fidelity import insertion

ROOT = Path(jaxsal.__file__).parent
ALLOWED = {
    "targets.py",  # the one place: jaxsal.targets.greedy and the targets' own argmax
}
ACTION_WORDS = {"q", "q_of", "logits", "logits_of", "out", "o", "outputs", "apply_fn", "policy", "pi"}


def _names(node) -> set:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}


def _is_minus_one(node) -> bool:
    return isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and getattr(
        node.operand, "value", None) == 1


def action_choices(text: str) -> list[int]:
    """Lines of `text` that choose an action: a `.choose(...)` call, or an argmax over the last axis
    (the action axis) or of an expression reading Q-values, logits or a model output."""
    lines = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "attr", getattr(node.func, "id", None))
        if name == "choose":
            lines.append(node.lineno)
        elif name == "argmax":
            method = isinstance(node.func, ast.Attribute) and not isinstance(node.func.value, ast.Name) \
                or (isinstance(node.func, ast.Attribute) and node.func.value.id not in ("jnp", "np", "jax"))
            args = ([node.func.value] if method else []) + list(node.args)
            axes = [kw.value for kw in node.keywords if kw.arg == "axis"] + args[1:2]
            if any(_is_minus_one(a) for a in axes) or (args and _names(args[0]) & ACTION_WORDS):
                lines.append(node.lineno)
    return sorted(lines)


def _allowed(rel: str) -> bool:
    return any(rel == a or (a.endswith("/") and rel.startswith(a)) for a in ALLOWED)


def test_no_action_is_chosen_outside_targets_greedy():
    found = [f"{p.relative_to(ROOT).as_posix()}:{line}" for p in sorted(ROOT.rglob("*.py"))
             if not _allowed(p.relative_to(ROOT).as_posix()) for line in action_choices(p.read_text())]
    assert not found, "choose actions through jaxsal.targets.greedy, not here:\n" + "\n".join(found)


@pytest.mark.parametrize("stray", ["jnp.argmax(q, -1)", "jnp.argmax(T.q_of(out), axis=-1)", "q.argmax(-1)",
                                   "np.argmax(logits, 1)", "target.choose(out)"])
def test_the_scan_finds_a_stray_choice_in_a_metrics_module(stray):
    text = (ROOT / "metrics" / "effects.py").read_text()
    assert action_choices(text) == []
    assert action_choices(text + f"\n\ndef _stray(q, out, logits, target):\n    return {stray}\n") != []


def test_the_scan_leaves_other_argmaxes_alone():
    text = "a = jnp.argmax(hist)\nb = jnp.argmax(maps.reshape(n, -1), axis=1)\nc = np.argmax(scores)\n"
    assert action_choices(text) == []


def _two_heads(params, obs):
    """Q-values and logits whose argmaxes differ: Q prefers action 0, the policy action 2."""
    s = obs.reshape(obs.shape[0], -1).mean(-1)
    return {"q": jnp.stack([s + 1, s, s - 1], -1), "logits": jnp.stack([s - 1, s, s + 1], -1),
            "value": s}


X = np.arange(2 * 4 * 4 * 1, dtype=np.float32).reshape(2, 4, 4, 1)
MAPS = np.arange(2 * 16, dtype=np.float32).reshape(2, 4, 4)


@pytest.mark.parametrize("target, want", [("q_chosen", 0), ("advantage", 0), ("policy_logit", 2),
                                          ("log_prob", 2), ("value", 0)])
def test_metrics_follow_the_targets_choice(target, want):
    r = insertion(_two_heads, None, X, MAPS, pixels_per_step=4, target=target)
    np.testing.assert_array_equal(np.asarray(r["actions"]), [want, want])
    d = displacement_effects(_two_heads, None, X, X[:, ::-1], target=target)
    np.testing.assert_array_equal(np.asarray(d.actions), [want, want])
    _, out = jaxsal.engine.run([], _two_heads, None, X, target=target, outputs=True)
    np.testing.assert_array_equal(np.asarray(out["actions"]), [want, want])
