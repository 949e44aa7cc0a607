"""One checked call for every method: the same bad input gives the same error from a gradient
and a perturbation method, because both run jaxsal.checks.check_call first. Cases come from the
conformance table, so a newly registered method is covered here too."""
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsal
from jaxsal.errors import SaliencyInputError
from tests._support.conformance import COMBINED, MODEL, PARAMS, _obs, cases

CASES = cases(only_shipped=True)

BAD = {
    "not callable": (lambda m: dict(apply_fn=None), "apply_fn must be callable"),
    "wrong channels": (lambda m: dict(obs=_obs()[..., :1]), "failed on obs of shape"),
    "q_action without actions": (lambda m: dict(target="q_action"), "needs actions"),
    "actions out of range": (lambda m: dict(actions=np.array([0, 1, 9])), "actions"),
    "actions wrong shape": (lambda m: dict(actions=np.array([0, 1])), r"shape \(N,\)"),
    "target not per sample": (lambda m: dict(target=lambda out: out), "one scalar per sample"),
    "batch_size zero": (lambda m: dict(batch_size=0), r"batch_size must be a positive int .*e\.g\. batch_size=256, got 0"),
    "NaN frames": (lambda m: dict(obs=jnp.full((3, 16, 16, 2), jnp.nan)), "NaN"),
}


@pytest.mark.parametrize("bad", sorted(BAD))
@pytest.mark.parametrize("method", sorted(CASES))
def test_every_method_rejects_bad_input_the_same_way(method, bad):
    change, message = BAD[bad]
    call = dict(apply_fn=MODEL.apply, params=PARAMS, obs=_obs(), method=COMBINED.get(method, method), **CASES[method])
    call.update(change(method))
    with pytest.raises(SaliencyInputError, match=message):
        jaxsal.explain(call.pop("apply_fn"), call.pop("params"), call.pop("obs"), **call)


def test_a_model_of_the_other_layout_is_refused_naming_the_layout_it_takes():
    def nchw(p, x):  # a channel-first model: (N, C, H, W) frames
        return MODEL.apply(p, x.transpose(0, 2, 3, 1))
    with pytest.raises(SaliencyInputError, match=r"takes channel-first frames \(N, 2, 16, 16\): pass "
                                                 r"layout='NCHW'"):
        jaxsal.explain(nchw, PARAMS, _obs(), method="gradient", layout="NHWC")


def test_a_list_of_methods_checks_the_frames_values_once(monkeypatch):
    from jaxsal import checks

    seen = []
    real = checks.check_finite
    monkeypatch.setattr(checks, "check_finite", lambda x, *a: seen.append(x.shape) or real(x, *a))
    jaxsal.explain(MODEL.apply, PARAMS, np.asarray(_obs(), np.float32), method=["gradient", "gradcam", "occlusion"],
                   patch=4, stride=4)
    assert seen == [(3, 16, 16, 2)]
    bad = np.asarray(_obs(), np.float32)
    bad[1, 2, 3, 0] = np.inf
    with pytest.raises(SaliencyInputError, match="state 1 of obs holds NaN or inf"):
        jaxsal.explain(MODEL.apply, PARAMS, bad, method=["gradient", "occlusion"], patch=4, stride=4)


def test_each_check_is_written_once():
    """The CLI and the batch job call jaxsal.checks; none of them keeps a copy of a check."""
    from pathlib import Path

    texts = {p: p.read_text() for p in Path(jaxsal.__file__).parent.rglob("*.py")}
    for needle in ("needs actions=(N,)", "holds NaN or inf values", "this agent takes uint8 pixels",
                   "action index out of range", "must give one scalar per sample"):
        where = [str(p) for p, t in texts.items() for _ in range(t.count(needle))]
        assert len(where) == 1, (needle, where)
    assert not [p for p, t in texts.items() if "eval_shape(agent.apply_fn" in t]  # the CLI probes via checks


@pytest.mark.parametrize("actions", [np.array([0, -1]), np.array([0, 2 ** 32 + 1])])
def test_actions_are_indices_even_where_the_model_has_no_action_count(actions):
    """Before: with the count unknown (no Q-vector or logits in the output) -1 passed (an index from the
    end) and 2**32 + 1 was cast to int32 action 1; both silently explained another action."""
    from jaxsal.targets import check_actions
    with pytest.raises(SaliencyInputError, match=r"action indices from 0 to 2\*\*31-1"):
        check_actions(actions, 2, None)
    np.testing.assert_array_equal(check_actions(np.array([0, 7]), 2, None), [0, 7])


@pytest.mark.parametrize("method,opts", [("rise", {"n_masks": 10 ** 12}), ("integrated_gradients", {"steps": 10 ** 12}),
                                         ("smoothgrad", {"n_samples": 10 ** 12})])
def test_a_count_beyond_int32_is_refused_naming_the_option(method, opts):
    """Before: RISE raised OverflowError from inside the mask draw, Integrated Gradients a MemoryError
    of terabytes, SmoothGrad ran without end."""
    import jax
    (name, value), = opts.items()
    with pytest.raises(SaliencyInputError, match=rf"{name} must be at most 2\*\*31-1 = 2147483647, got {value}"):
        jaxsal.explain(MODEL.apply, PARAMS, _obs(), method=method, key=jax.random.PRNGKey(0), **opts)
    assert jaxsal.checks.check_positive_int("n", 2 ** 31 - 1) == 2 ** 31 - 1
