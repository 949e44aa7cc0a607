"""Targets: turn an agent's output pytree into one scalar per sample (what is explained).

The action a target refers to is fixed once from the clean (unperturbed) input, so that
noisy, interpolated or perturbed copies explain the same action as the original state.
Output conventions: an array is the Q-vector (or policy logits); a dict may hold `q`,
`logits` (or `policy_logits`/`pi`), `value`, `advantage`; a 2-tuple is (logits or Q, value).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from jaxsal.errors import SaliencyInputError

TARGET_NAMES = ("q_chosen", "q_action", "advantage", "value", "policy_logit", "log_prob",
                "softmax_chosen")
LOGIT_KEYS = ("logits", "policy_logits", "pi", "policy")  # dict outputs: keys read as policy logits
Q_KEYS = ("q", "q_values")                                  # and as Q-values
INT32_MAX = 2 ** 31 - 1  # jax's action indices, counts and shapes are int32 (jaxsal.checks' counts use it too)


def _pick(out, keys, what):
    if isinstance(out, dict):
        for k in keys:
            if k in out:
                return out[k]
        raise SaliencyInputError(
            f"target needs {what}, but the model output dict has keys {sorted(out)}; "
            f"expected one of {list(keys)}, or pass target=callable(output) -> (N,)")
    if isinstance(out, (tuple, list)):
        if len(out) == 2:
            return out[0]
        raise SaliencyInputError(
            f"cannot find {what} in a model output tuple of length {len(out)}; "
            "pass target=callable(output) -> (N,)")
    return out


def q_of(out):
    """The Q-vector (N, A) of an output pytree.

    Args:
        out (jax.Array | dict | tuple): the model's output: an array (read as Q-values), a dict with
            a key of `Q_KEYS` (else of `LOGIT_KEYS`), or a `(Q or logits, value)` tuple.

    Returns:
        jax.Array: the Q-values (N, A).

    Raises:
        jaxsal.SaliencyInputError: a dict without such a key, or a tuple that is not a pair.
    """
    return _pick(out, Q_KEYS + LOGIT_KEYS, "a Q-vector")


def logits_of(out):
    """The policy logits (N, A) of an output pytree.

    Args:
        out (jax.Array | dict | tuple): the model's output: an array (read as logits), a dict with a
            key of `LOGIT_KEYS` (else of `Q_KEYS`), or a `(logits, value)` tuple.

    Returns:
        jax.Array: the logits (N, A).

    Raises:
        jaxsal.SaliencyInputError: a dict without such a key, or a tuple that is not a pair.
    """
    return _pick(out, LOGIT_KEYS + Q_KEYS, "policy logits")


def value_of(out):
    """The state value (N,) of an output pytree.

    Args:
        out (dict | tuple): the model's output: a dict with a `value` key, or a `(logits, value)` tuple;
            a value of shape (N, 1) is read as (N,).

    Returns:
        jax.Array: the values (N,).

    Raises:
        jaxsal.SaliencyInputError: the output has no value (one array, or a dict without `value`).
    """
    if isinstance(out, dict) and "value" in out:
        v = out["value"]
    elif isinstance(out, (tuple, list)) and len(out) == 2:
        v = out[1]
    else:
        raise SaliencyInputError(
            "target='value' needs a value output (dict key 'value' or a (logits, value) tuple); "
            "this model outputs " + (f"dict keys {sorted(out)}" if isinstance(out, dict) else
                                      f"one array of shape {tuple(out.shape)} (Q-values or logits)"
                                      if hasattr(out, "shape") else f"{type(out).__name__}"))
    return v.reshape(v.shape[0], -1)[:, 0] if v.ndim > 1 else v


def _take(x, actions):
    return jnp.take_along_axis(x, actions[:, None].astype(jnp.int32), axis=-1)[:, 0]


class Target(NamedTuple):
    """`score(out, actions) -> (N,)`; `choose(out) -> (N,)` actions from the clean output."""
    name: str
    score: Callable
    choose: Callable


def _no_action(out):
    return jnp.zeros(jax.tree.leaves(out)[0].shape[0], jnp.int32)


def _argmax_q(out):
    return jnp.argmax(q_of(out), axis=-1)


def _argmax_logits(out):
    return jnp.argmax(logits_of(out), axis=-1)


_TARGETS = {
    "q_chosen": Target("q_chosen", lambda o, a: _take(q_of(o), a), _argmax_q),
    "q_action": Target("q_action", lambda o, a: _take(q_of(o), a), _argmax_q),
    "advantage": Target("advantage",
                        lambda o, a: _take(q_of(o), a) - q_of(o).mean(-1), _argmax_q),
    "value": Target("value", lambda o, a: value_of(o), _no_action),
    "policy_logit": Target("policy_logit", lambda o, a: _take(logits_of(o), a), _argmax_logits),
    "log_prob": Target("log_prob", lambda o, a: _take(jax.nn.log_softmax(logits_of(o)), a),
                       _argmax_logits),
    "softmax_chosen": Target("softmax_chosen",
                             lambda o, a: _take(jax.nn.softmax(q_of(o)), a), _argmax_q),
}


def explains_action(target) -> bool:
    """Whether a target explains an action: False for `value` and a callable, which depend on none.

    Args:
        target (str | Target | Callable): a target name, a `Target`, or a callable `output -> (N,)`.

    Returns:
        bool: True for the targets that score one action per state.

    Raises:
        jaxsal.SaliencyInputError: an unknown target name.
    """
    return (target if isinstance(target, Target) else get_target(target)).choose is not _no_action


def get_target(target) -> Target:
    """The `Target` of a name or of a callable `output -> (N,)` (which ignores the action).

    Args:
        target (str | Callable): one of `TARGET_NAMES`, or a callable from the model's output to (N,).

    Returns:
        Target: its name, `score(out, actions) -> (N,)` and `choose(out) -> (N,)`.

    Raises:
        jaxsal.SaliencyInputError: an unknown target name.
    """
    if callable(target) and not isinstance(target, str):
        fn = target
        return Target(getattr(fn, "__name__", "callable"), lambda o, a: fn(o), _no_action)
    if target not in _TARGETS:
        raise SaliencyInputError(
            f"unknown target {target!r}; choose one of {list(TARGET_NAMES)} or pass a callable "
            "output -> (N,)")
    return _TARGETS[target]


def require_actions(target) -> None:
    """Refuses `q_action` without actions: it explains the caller's actions and chooses none itself.

    Args:
        target (str | Target): the target, by name or as a `Target`.

    Raises:
        jaxsal.SaliencyInputError: the target is `q_action` (call this only where no actions were given).
    """
    if getattr(target, "name", target) == "q_action":
        raise SaliencyInputError("target='q_action' needs actions=(N,) integer actions")


def greedy(target: Target, out, agent: bool = False):
    """The target's greedy action per state on the clean output, without gradient.

    This is the one place jaxsal chooses an action. Targets that explain no action (value, a
    callable) choose 0, unless `agent` is set.

    Args:
        target (Target): the target (`get_target`).
        out (jax.Array | dict | tuple): the model's output on the clean (unperturbed) frames.
        agent (bool): for a target that explains no action, choose the agent's own greedy action
            (argmax of its Q-vector or logits) instead of 0, e.g. to tell whether removing an
            object flips what the agent would play.

    Returns:
        jax.Array: the actions (N,), int32.
    """
    choose = _argmax_q if agent and not explains_action(target) else target.choose
    return jax.lax.stop_gradient(choose(out)).astype(jnp.int32)


def resolve_actions(target: Target, out, actions=None):
    """The action each state's map explains: the caller's, or the target's greedy choice.

    Args:
        target (Target): the target (`get_target`).
        out (jax.Array | dict | tuple): the model's output on the clean frames.
        actions (jax.Array | numpy.ndarray | None): the caller's actions (N,) (checked with
            `check_actions` beforehand), or None for `greedy`'s choice.

    Returns:
        jax.Array: the actions (N,), int32.

    Raises:
        jaxsal.SaliencyInputError: no actions for `q_action`.
    """
    if actions is None:
        require_actions(target)
        return greedy(target, out)
    return jnp.asarray(actions, jnp.int32)


def check_actions(actions, n: int, num_actions: int | None):
    """Checks a caller's actions: shape (N,), integers in [0, num_actions).

    Traced actions (under `jax.jit` or `jax.vmap`) get the shape and dtype checks only: their values
    are not known yet.

    Args:
        actions (int | numpy.ndarray | jax.Array): one action for every state, or one per state (N,).
        n (int): the number of states N.
        num_actions (int | None): the model's number of actions, or None where it is not known
            (then only indices below 0 or beyond int32 are refused).

    Returns:
        numpy.ndarray | jax.Array: the actions (N,) as int32 (a jax array where they were traced).

    Raises:
        jaxsal.SaliencyInputError: a wrong shape, a dtype that is not integer, or an action out of range.
    """
    import numpy as np

    if isinstance(actions, jax.core.Tracer):
        a = actions if actions.ndim else jnp.full((n,), actions)
        if a.shape != (n,):
            raise SaliencyInputError(f"actions must have shape (N,) = ({n},), got {a.shape}")
        if not jnp.issubdtype(a.dtype, jnp.integer):
            raise SaliencyInputError(f"actions must be integers, got dtype {a.dtype}")
        return a.astype(jnp.int32)
    a = np.asarray(actions)
    if a.ndim == 0:
        a = np.full((n,), int(a))
    if a.shape != (n,):
        raise SaliencyInputError(f"actions must have shape (N,) = ({n},), got {a.shape}")
    if not np.issubdtype(a.dtype, np.integer):
        raise SaliencyInputError(f"actions must be integers, got dtype {a.dtype}")
    if num_actions is not None and ((a < 0).any() or (a >= num_actions).any()):
        raise SaliencyInputError(
            f"action index out of range: the model has {num_actions} actions (0..{num_actions - 1}), "
            f"got values in [{a.min()}, {a.max()}]")
    if a.size and (int(a.min()) < 0 or int(a.max()) > INT32_MAX):  # the model's count unknown:
        # a negative index would pick an action from the end, and the int32 cast wraps 2**32 + 1 onto action 1
        raise SaliencyInputError(f"actions must be action indices from 0 to 2**31-1, got values in "
                                 f"[{a.min()}, {a.max()}]")
    return a.astype(np.int32)
