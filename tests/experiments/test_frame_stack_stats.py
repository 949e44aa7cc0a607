"""jaxsal.metrics.frames (per-frame attribution shares) and the frame-stack study's statistic
(experiments.frame_stack_bug.stats: AUC, separation steps) on synthetic maps."""
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsal
from jaxsal.errors import SaliencyInputError
from experiments.frame_stack_bug.stats import auc, auc_curve, separation_step, stack_age_gain, trailing_mean
from jaxsal.metrics import age_centroid, frame_shares, newest_share


def synthetic_maps(profile, n=5, hw=6, c=2, seed=0):
    """Random-sign maps whose |mass| per stacked frame follows `profile` (frame-major channels)."""
    rng = np.random.default_rng(seed)
    k = len(profile)
    m = rng.uniform(0.5, 1.5, (n, hw, hw, k * c)) * rng.choice([-1, 1], (n, hw, hw, k * c))
    for j, w in enumerate(profile):
        block = m[..., j * c:(j + 1) * c]
        m[..., j * c:(j + 1) * c] = block / np.abs(block).sum(axis=(1, 2, 3), keepdims=True) * w
    return m


def test_frame_shares_hand_computed():
    m = np.zeros((1, 2, 2, 6))
    m[0, 0, 0, 0], m[0, 1, 1, 1] = 1.0, -1.0        # frame 0: mass 2
    m[0, 0, 1, 2] = 3.0                             # frame 1: mass 3
    m[0, :, :, 4:] = -1.25                          # frame 2: mass 8 * 1.25 = 10
    np.testing.assert_allclose(frame_shares(m, 3), [[2 / 15, 3 / 15, 10 / 15]])
    np.testing.assert_allclose(frame_shares(np.zeros((2, 3, 3, 4)), 4), np.full((2, 4), 0.25))


def test_shares_follow_the_synthetic_profile_and_reference_loop():
    prof = [0.1, 0.15, 0.25, 0.5]
    m = synthetic_maps(prof, c=3)
    s = frame_shares(m, 4)
    np.testing.assert_allclose(s, np.tile(prof, (5, 1)), atol=1e-12)
    # reference: a plain loop over states and frames
    ref = np.zeros((5, 4))
    for i in range(5):
        for j in range(4):
            ref[i, j] = sum(abs(m[i, y, x, j * 3 + ch]) for y in range(6) for x in range(6) for ch in range(3))
        ref[i] /= ref[i].sum()
    np.testing.assert_allclose(s, ref, rtol=1e-12)


def test_bug_signatures_on_synthetic_maps():
    """The degenerate profiles the bugs produce are told apart from a correct one."""
    correct = frame_shares(synthetic_maps([0.1, 0.15, 0.25, 0.5]), 4)
    reversed_ = frame_shares(synthetic_maps([0.5, 0.25, 0.15, 0.1]), 4)
    no_update = frame_shares(synthetic_maps([0.25] * 4), 4)
    reuse = frame_shares(synthetic_maps([0.01, 0.01, 0.01, 0.97]), 4)
    ns = {k: newest_share(v).mean() for k, v in dict(c=correct, r=reversed_, n=no_update, u=reuse).items()}
    assert ns["u"] > ns["c"] > ns["n"] > ns["r"]
    assert np.isclose(ns["n"], 0.25)
    ac = {k: age_centroid(v).mean() for k, v in dict(c=correct, r=reversed_, n=no_update, u=reuse).items()}
    assert np.isclose(ac["n"], 1.5) and np.isclose(ac["c"] + ac["r"], 3.0) and ac["u"] < ac["c"]


def test_shares_of_real_gradient_maps_find_the_frame_the_model_reads():
    """A model that reads only stacked frame j gets all its gradient mass on frame j."""
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.normal(size=(5, 5, 2)))
    obs = rng.uniform(0, 255, (3, 5, 5, 8)).astype(np.float32)     # 4 frames x 2 channels
    for j in range(4):
        def apply_fn(params, x, j=j):
            return jnp.stack([(x[..., 2 * j:2 * j + 2] * params).sum((1, 2, 3)),
                              jnp.zeros(x.shape[0])], -1)
        maps = jaxsal.explain(apply_fn, w, obs, method="gradient", per_frame=True,
                              actions=np.zeros(3, int))
        expected = np.zeros((3, 4))
        expected[:, j] = 1.0
        np.testing.assert_allclose(frame_shares(maps, 4), expected, atol=1e-6)


def test_trailing_mean_is_causal_and_hand_computed():
    np.testing.assert_allclose(trailing_mean([1.0, 3.0, 5.0, 7.0, 100.0], 3), [1, 2, 3, 5, 112 / 3])
    np.testing.assert_allclose(trailing_mean([2.0, 4.0], 1), [2, 4])
    x = np.arange(12.0).reshape(6, 2)
    np.testing.assert_allclose(trailing_mean(x, 2)[3], (x[2] + x[3]) / 2)
    # causal: a change at t=4 leaves every earlier value alone (a centred window would not)
    a, b = np.zeros(6), np.zeros(6)
    b[4] = 10.0
    ta, tb = trailing_mean(a, 3), trailing_mean(b, 3)
    np.testing.assert_array_equal(ta[:4], tb[:4])
    np.testing.assert_allclose(tb[4:], [10 / 3, 10 / 3])


def _run(profiles, methods=3, seed=0):
    """(T, M, N, k) shares from synthetic per-frame maps, one target profile per snapshot."""
    return np.stack([np.stack([frame_shares(synthetic_maps(p, n=4, seed=seed + 7 * t + m), len(p))
                               for m in range(methods)]) for t, p in enumerate(profiles)])


def test_stack_age_gain_on_synthetic_maps_signs_and_values():
    init = [0.3, 0.2, 0.3, 0.2]                               # the seed's random-init profile
    correct = _run([init, init, [0.2, 0.2, 0.25, 0.35], [0.15, 0.2, 0.25, 0.4]])
    reuse = _run([init, init, [0.1, 0.1, 0.1, 0.7], [0.05, 0.05, 0.05, 0.85]])
    reversed_ = _run([init[::-1], init[::-1], [0.35, 0.25, 0.2, 0.2], [0.4, 0.25, 0.2, 0.15]])
    no_update = _run([init, init, [0.27, 0.23, 0.27, 0.23], [0.25] * 4])
    ages = np.array([3, 2, 1, 0])
    a0 = init @ ages                                          # 1.6
    # window 1: the plain gain over the first snapshot, hand-computed
    np.testing.assert_allclose(stack_age_gain(correct, 1), [0, 0, 1.25 - a0, 1.1 - a0], atol=1e-12)
    np.testing.assert_allclose(stack_age_gain(reuse, 1), [0, 0, 0.6 - a0, 0.3 - a0], atol=1e-12)
    np.testing.assert_allclose(stack_age_gain(no_update, 1)[-1], 1.5 - a0, atol=1e-12)
    # reversing the slots mirrors the ages (a -> 3 - a), so the gain changes sign
    np.testing.assert_allclose(stack_age_gain(reversed_, 1), -stack_age_gain(correct, 1), atol=1e-12)
    # window 2: causal mean of the last two gains
    g = stack_age_gain(correct, 1)
    np.testing.assert_allclose(stack_age_gain(correct, 2), [0, 0, g[2] / 2, (g[2] + g[3]) / 2], atol=1e-12)
    last = {k: stack_age_gain(v)[-1] for k, v in dict(c=correct, u=reuse, r=reversed_, n=no_update).items()}
    assert last["u"] < last["c"] < 0 < last["r"]


def test_stack_age_gain_removes_the_init_profile_and_averages_methods():
    # two runs with different random-init profiles and the same learned change: same statistic
    a = _run([[0.4, 0.2, 0.2, 0.2], [0.3, 0.2, 0.2, 0.3]], methods=1)
    b = _run([[0.1, 0.3, 0.3, 0.3], [0.0, 0.3, 0.3, 0.4]], methods=1)
    np.testing.assert_allclose(stack_age_gain(a, 1), stack_age_gain(b, 1), atol=1e-12)
    # one method moving and two not: a third of the move (methods are averaged, not maxed)
    flat = [0.25] * 4
    moved = np.concatenate([_run([flat, [0, 0, 0, 1.0]], methods=1), _run([flat, flat], methods=2)], axis=1)
    np.testing.assert_allclose(stack_age_gain(moved, 1), [0, (0 - 1.5) / 3], atol=1e-12)
    # probes are averaged too: per-probe profiles built by hand
    sh = np.zeros((2, 1, 2, 4))
    sh[:, 0, :, :] = 0.25
    sh[1, 0, 0] = [1, 0, 0, 0]                                # probe 0 moves to age 3
    np.testing.assert_allclose(stack_age_gain(sh, 1), [0, (3 - 1.5) / 2])


def test_stack_age_gain_separates_bugs_over_noisy_synthetic_seeds():
    """Five noisy seeds per variant: AUC-based separation for reuse (-) and reversed (+), none
    for a variant with the correct dynamics (a `misaligned` stand-in)."""
    rng = np.random.default_rng(1)
    T, steps = 8, list(range(0, 800, 100))

    def runs(target, n=5):
        out = []
        for s in range(n):
            init = rng.dirichlet(np.full(4, 50.0))
            w = np.clip(np.linspace(-0.2, 1.2, T), 0, 1)[:, None]      # learning starts at t=2
            prof = (1 - w) * init + w * np.asarray(target) + rng.normal(0, 0.01, (T, 4))
            prof = np.abs(prof) / np.abs(prof).sum(-1, keepdims=True)
            out.append(stack_age_gain(_run(list(prof), methods=2, seed=s)))
        return np.stack(out)
    correct = runs([0.2, 0.2, 0.25, 0.35])
    reuse, reversed_ = runs([0.1, 0.1, 0.1, 0.7]), runs([0.35, 0.25, 0.2, 0.2])
    same = runs([0.2, 0.2, 0.25, 0.35])
    st, d, _ = separation_step(steps, reuse, correct)
    assert d == "-" and st is not None and st <= 400
    st, d, _ = separation_step(steps, reversed_, correct)
    assert d == "+" and st is not None and st <= 400
    assert separation_step(steps, same, correct)[0] is None


def test_auc_hand_values():
    assert auc([3, 4], [1, 2]) == 1.0
    assert auc([1, 2], [3, 4]) == 0.0
    assert auc([1, 3], [2, 2]) == 0.5
    assert auc([2], [2]) == 0.5
    # pairs: 1 beats 0; 2 beats 0, ties 2; 3 beats 0 and 2 -> (1 + 1.5 + 2) / 9
    assert auc([1, 2, 3], [0, 2, 5]) == pytest.approx(4.5 / 9)


def test_separation_step_sustained_and_one_direction():
    steps = [0, 10, 20, 30, 40]
    correct = np.array([[0, 0, 0, 0, 0], [1, 1, 1, 1, 1], [2, 2, 2, 2, 2]], float)
    up = correct + np.array([0, 0, 5, 5, 5])               # above from step 20 on
    assert separation_step(steps, up, correct)[:2] == (20, "+")
    down = correct - np.array([0, 5, 5, 5, 5])
    assert separation_step(steps, down, correct)[:2] == (10, "-")
    # separated early by chance, then not, then again: only the final sustained stretch counts
    blip = correct + np.array([5, 0, 0, 5, 5])
    assert separation_step(steps, blip, correct)[:2] == (30, "+")
    # flips direction at the end: the stretch starts at the flip
    flip = correct + np.array([0, 5, 5, -5, -5])
    assert separation_step(steps, flip, correct)[:2] == (30, "-")
    # never separated (overlapping): None
    assert separation_step(steps, correct + 0.5, correct)[:2] == (None, None)
    # not separated at the end: None
    assert separation_step(steps, correct + np.array([5, 5, 5, 5, 0]), correct)[0] is None
    np.testing.assert_allclose(auc_curve(up, correct), [0.5, 0.5, 1, 1, 1])   # equal groups: 0.5


def test_errors_are_clear():
    with pytest.raises(SaliencyInputError, match="per_frame=True"):
        frame_shares(np.zeros((2, 3, 3)), 1)
    with pytest.raises(SaliencyInputError, match="dividing the channel count 6"):
        frame_shares(np.zeros((1, 2, 2, 6)), 4)
    with pytest.raises(SaliencyInputError, match="NaN"):
        frame_shares(np.full((1, 2, 2, 2), np.nan), 2)
    with pytest.raises(SaliencyInputError, match="at least one value"):
        auc([], [1])
    with pytest.raises(SaliencyInputError, match="equal checkpoints"):
        auc_curve(np.zeros((2, 3)), np.zeros((2, 4)))
    with pytest.raises(SaliencyInputError, match="window must be a positive int"):
        trailing_mean([1.0], 0)
    with pytest.raises(SaliencyInputError, match="snapshots, methods, probes, frames"):
        stack_age_gain(np.zeros((3, 4)))
    with pytest.raises(SaliencyInputError, match="NaN"):
        stack_age_gain(np.full((2, 1, 1, 4), np.nan))
    with pytest.raises(SaliencyInputError, match="2 steps for 3 checkpoints"):
        separation_step([0, 1], np.zeros((2, 3)), np.zeros((2, 3)))


@pytest.mark.slow
def test_no_update_premise_identical_slots_get_identical_first_layer_updates():
    """The `no_update` argument of the module docstring, checked on our MinAtar network and
    PQN's optimiser: with every stacked slot holding the same frame, each slot's first-layer
    kernel moves by exactly the same amount, so only the init tells the slots apart; with a
    real (different-frames) stack the slots' updates differ."""
    import jax
    import jax.numpy as jnp

    from jaxsal_agents.networks import MinAtarDQN
    from jaxsal_agents.train import PQNConfig, make_optimizer

    model = MinAtarDQN(3, 12)
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 10, 10, 12)))
    tx = make_optimizer(PQNConfig(steps=4096, num_envs=8, rollout=8, lr=3e-3))
    rng = np.random.default_rng(0)
    frames = (rng.random((32, 5, 10, 10, 3)) < 0.2).astype(np.float32)     # 5 frames per state
    targets = jnp.asarray(rng.normal(size=32), jnp.float32)

    @jax.jit  # one compile for both stacks (op by op, the optimiser's update takes seconds)
    def step(p, state, obs):
        def loss(q):
            return jnp.mean((model.apply(q, obs)[:, 0] - targets) ** 2)
        updates, state = tx.update(jax.grad(loss)(p), state, p)
        return jax.tree.map(lambda a, b: a + b, p, updates), state

    def deltas(obs):
        p, state = params, tx.init(params)
        for _ in range(3):
            p, state = step(p, state, obs)
        d = np.asarray(p["params"]["conv1"]["kernel"] - params["params"]["conv1"]["kernel"])
        return [d[:, :, 3 * j:3 * j + 3] for j in range(4)]

    same = deltas(jnp.asarray(np.concatenate([frames[:, 4]] * 4, -1)))       # no_update stacks
    real = deltas(jnp.asarray(np.concatenate([frames[:, j] for j in range(1, 5)], -1)))
    assert np.abs(same[0]).max() > 1e-4                                      # it did learn
    for j in range(1, 4):
        np.testing.assert_allclose(same[j], same[0], rtol=0, atol=1e-6)      # float32 sum order
        assert np.abs(real[j] - real[0]).max() > 1e-4
