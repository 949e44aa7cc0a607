"""precision="bfloat16": every conv and matmul of a method's traced computation, backward passes
included, on bfloat16 operands with float32 accumulation (jaxsal.engine.precision); float32 is the
plain path; the precision is part of the compile-cache key; it reaches the engine from
jaxsal.explain, `jaxsal explain --precision` and a sweep's `precision` key."""
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsal
from jaxsal import caching
from jaxsal.cli import main
from jaxsal.engine.precision import with_precision
from jaxsal.errors import SaliencyInputError
from jaxsal.io import sweep as sw
from tests._support.cli_support import frames, make_agent_files


class SmallCNN(nn.Module):
    """A Nature-style CNN on uint8 frames, cast to float32 inside (as the shipped agents do)."""

    @nn.compact
    def __call__(self, x):
        x = x.astype(jnp.float32) / 255.0
        x = nn.relu(nn.Conv(8, (4, 4), (2, 2), padding="VALID", name="conv1")(x))
        x = nn.relu(nn.Conv(8, (3, 3), (1, 1), padding="VALID", name="conv2")(x))
        x = nn.relu(nn.Dense(16, name="fc")(x.reshape((x.shape[0], -1))))
        return nn.Dense(3, name="q")(x)


@pytest.fixture(scope="module")
def cnn():
    obs = np.random.default_rng(0).integers(0, 256, (6, 20, 20, 2), dtype=np.uint8)
    m = SmallCNN()
    params = m.init(jax.random.PRNGKey(0), obs)
    params = jax.tree.map(lambda v: v + 0.05 * jax.random.normal(jax.random.PRNGKey(1), v.shape), params)
    return m.apply, params, obs


CHEAP = {"gradient": {}, "gradcam": {}, "occlusion": {"patch": 4, "stride": 4},
         # its ridge solve is a custom_linear_solve, whose jaxprs are a named tuple with None entries
         "lime": {"n_samples": 48, "segmentation_options": {"n_segments": 8}, "key": jax.random.PRNGKey(2)}}


def _maps(cnn, method, **kw):
    apply_fn, params, obs = cnn
    return jaxsal.explain(apply_fn, params, obs, method=method, **CHEAP.get(method, {}), **kw)


def _products(jaxpr, highest: bool = False) -> list:
    """(primitive, operand dtypes, output dtype) of every conv and matmul of a jaxpr and its
    sub-jaxprs; those that ask for Precision.HIGHEST only with highest=True."""
    out = []
    for eqn in jaxpr.eqns:
        p = eqn.params.get("precision")
        top = any(q == jax.lax.Precision.HIGHEST for q in (p if isinstance(p, tuple) else (p,)))
        if eqn.primitive.name in ("conv_general_dilated", "dot_general") and top == highest:
            out.append((eqn.primitive.name, tuple(str(v.aval.dtype) for v in eqn.invars),
                        str(eqn.outvars[0].aval.dtype)))
        for v in eqn.params.values():
            for sub in v if isinstance(v, tuple) else (v,):
                sub = getattr(sub, "jaxpr", sub)
                if hasattr(sub, "eqns"):
                    out += _products(sub, highest)
    return out


def _input_gradient(apply_fn, params):
    return lambda x: jax.grad(lambda x: apply_fn(params, x)[:, 0].sum())(x)


def test_float32_is_the_plain_function_and_the_default(cnn):
    f = _input_gradient(*cnn[:2])
    assert with_precision(f, "float32") is f  # no rewrite at all
    for method in CHEAP:
        np.testing.assert_array_equal(np.asarray(_maps(cnn, method)), np.asarray(_maps(cnn, method, precision="float32")))


def test_bfloat16_runs_every_conv_and_matmul_on_bf16_operands_backward_included(cnn):
    apply_fn, params, obs = cnn
    x = jnp.asarray(obs, jnp.float32)
    f = _input_gradient(apply_fn, params)
    plain = _products(jax.make_jaxpr(f)(x).jaxpr)
    low = _products(jax.make_jaxpr(with_precision(f, "bfloat16"))(x).jaxpr)
    assert sum(p == "conv_general_dilated" for p, _, _ in plain) >= 3  # forward convs and their transposes
    assert all(ins == ("float32", "float32") for _, ins, _ in plain)
    assert [p for p, _, _ in low] == [p for p, _, _ in plain]
    assert all(ins == ("bfloat16", "bfloat16") and o == "float32" for _, ins, o in low), low


def test_bfloat16_reaches_into_scan_cond_while_remat_jit_and_custom_jvp_bodies():
    w = jnp.linspace(-1.0, 1.0, 9, dtype=jnp.float32).reshape(3, 3) / 3.0  # not bf16-exact

    def f(x):
        y = jax.lax.scan(lambda c, r: (c + r @ w, r @ w), jnp.zeros(3), x)[1]
        y = jax.lax.cond(y.sum() > 0, lambda v: v @ w, lambda v: v, y)
        y = jax.lax.while_loop(lambda c: c[0] < 2, lambda c: (c[0] + 1, c[1] @ w), (0, y))[1]
        y = jax.checkpoint(lambda v: jax.jit(jax.nn.gelu)(v @ w))(y)
        return jax.grad(lambda v: (jax.nn.relu(v @ w) ** 2).sum())(y)

    x = jnp.linspace(0.0, 1.0, 12, dtype=jnp.float32).reshape(4, 3)
    low = _products(jax.make_jaxpr(with_precision(f, "bfloat16"))(x).jaxpr)
    assert len(low) >= 7 and all(ins == ("bfloat16", "bfloat16") and o == "float32" for _, ins, o in low), low
    assert not np.array_equal(np.asarray(with_precision(f, "bfloat16")(x)), np.asarray(f(x)))


@pytest.mark.parametrize("method", ["gradcam", "occlusion"])
def test_the_whole_traced_call_is_bfloat16_but_the_greedy_choice(cnn, method):
    apply_fn, params, obs = cnn
    x = jnp.asarray(obs, jnp.float32)

    def traced(precision, highest=False, **kw):
        return _products(jax.make_jaxpr(lambda o: jaxsal.explain(apply_fn, params, o, method=method, precision=precision,
                                                                 **CHEAP[method], **kw))(x).jaxpr, highest)

    assert all(ins == ("float32", "float32") for _, ins, _ in traced("float32"))
    low = traced("bfloat16")
    plain = [p for p in low if p[1] == ("float32", "float32")]
    assert len(plain) == 4, low  # the greedy choice: one float32 forward (2 convs, 2 matmuls)
    assert len(low) >= 8 and sum(ins == ("bfloat16", "bfloat16") for _, ins, _ in low) == len(low) - 4
    if method == "gradcam":  # given actions: no greedy forward, every product bfloat16
        acts = jnp.zeros(len(obs), jnp.int32)
        given = traced("bfloat16", actions=acts)
        assert len(given) == len(low) - 4 and all(ins == ("bfloat16", "bfloat16") for _, ins, _ in given)
        upsample = traced("bfloat16", highest=True, actions=acts)  # the CAM's resize asks for HIGHEST: kept
        assert upsample and all(ins == ("float32", "float32") for _, ins, _ in upsample)


def test_an_inner_loop_call_is_bfloat16_in_every_program_but_the_greedy_choice(cnn):
    """Occlusion in rows of 8 (several groups of patches: the clean forward, a per-chunk program, a step per
    group, the finalize): the per-chunk program's forward (the clean output every group's scores compare
    with) is bfloat16 too, as in the one-program call; only the greedy choice's forward is float32."""
    apply_fn, params, obs = cnn
    x = jnp.asarray(obs, jnp.float32)
    low = _products(jax.make_jaxpr(lambda o: jaxsal.explain(apply_fn, params, o, method="occlusion", batch_size=8,
                                                            precision="bfloat16", **CHEAP["occlusion"]))(x).jaxpr)
    plain = [p for p in low if p[1] == ("float32", "float32")]
    assert len(plain) == 4, low  # the greedy choice: 2 convs, 2 matmuls
    assert len(low) >= 12 and sum(ins == ("bfloat16", "bfloat16") for _, ins, _ in low) == len(low) - 4


@pytest.mark.parametrize("method", sorted(CHEAP))
def test_bfloat16_maps_are_float32_differ_and_correlate(cnn, method):
    a = np.asarray(_maps(cnn, method))
    b = _maps(cnn, method, precision="bfloat16")
    assert b.dtype == jnp.float32 and b.shape == a.shape
    b = np.asarray(b)
    assert not np.array_equal(a, b)
    r = [np.corrcoef(u.ravel(), v.ravel())[0, 1] for u, v in zip(a, b)]
    assert min(r) > 0.9, r


def test_bfloat16_under_jit_and_vmap(cnn):
    """Equal to the eager maps to bfloat16 precision: XLA may keep more precision where it fuses
    a rounding into its neighbours (its allow-excess-precision default), so not bit for bit."""
    apply_fn, params, obs = cnn
    want = np.asarray(_maps(cnn, "gradient", precision="bfloat16"))
    x = jnp.asarray(obs, jnp.float32)
    explain = lambda o: jaxsal.explain(apply_fn, params, o, method="gradient", precision="bfloat16")  # noqa: E731
    jitted = np.asarray(jax.jit(explain)(x))
    vmapped = np.asarray(jax.vmap(explain)(x.reshape((2, 3) + x.shape[1:]))).reshape(want.shape)
    plain = np.asarray(_maps(cnn, "gradient"))
    err = lambda a, b: np.abs(a - b).max() / np.abs(b).max()  # noqa: E731
    assert err(jitted, want) < 0.01 and err(vmapped, want) < 0.01
    assert err(jitted, plain) > 0.01 and err(vmapped, plain) > 0.01  # bfloat16 under jit and vmap too
    f = _input_gradient(apply_fn, params)  # the rewrite itself under vmap: per-state = batched
    low = with_precision(f, "bfloat16")
    one, batched = jax.jit(jax.vmap(lambda xi: low(xi[None])[0]))(x), jax.jit(low)(x)
    assert err(np.asarray(one), np.asarray(batched)) < 0.01 and err(np.asarray(one), np.asarray(jax.jit(f)(x))) > 0.01


@pytest.mark.parametrize("method", ["gradient", "occlusion"])
def test_the_compile_cache_keeps_precisions_apart(cnn, method):
    count = lambda: caching.cache_names().count("_build")  # noqa: E731  (the engine's chunk programs)
    caching.clear_caches()  # as in a fresh process: earlier tests compiled both precisions
    a = np.asarray(_maps(cnn, method))
    n = count()
    b = np.asarray(_maps(cnn, method, precision="bfloat16"))
    m = count()
    assert m > n  # programs of its own (occlusion's steps and finalize: one each)
    c = np.asarray(_maps(cnn, method))
    assert count() == m
    np.testing.assert_array_equal(a, c)  # float32 after bfloat16: the float32 program, bit for bit
    assert not np.array_equal(a, b)


@pytest.mark.parametrize("method", ["gradient", "occlusion"])
def test_an_unknown_precision_is_one_line_naming_the_choices(cnn, method):
    for bad in ("float16", "bf16", None):
        with pytest.raises(SaliencyInputError, match=r"precision must be one of 'float32', 'bfloat16', got"):
            _maps(cnn, method, precision=bad)
    with pytest.raises(SaliencyInputError, match="precision must be one of"):
        with_precision(lambda x: x, "fp8")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny MinAtar agent's card and a buffer of 5 frames."""
    d = tmp_path_factory.mktemp("precision")
    card = make_agent_files(d / "runs")
    np.save(d / "buf.npy", frames(5, seed=1))
    return d, card


def _reference(card, x, **kw):
    import jaxsal_agents

    agent = jaxsal_agents.load(str(card))
    return np.asarray(jaxsal.explain(agent.apply_fn, agent.params, x, method="gradient", **kw))


def test_cli_precision_flag_reaches_the_engine(tiny, capsys):
    d, card = tiny
    out = d / "cli_out"
    args = ["explain", "--agent", str(card), "--methods", "gradient", "--input", str(d / "buf.npy"), "--quiet"]
    assert main(args + ["--out", str(out), "--precision", "bfloat16"]) == 0
    maps = np.asarray(jaxsal.load_maps(out, "gradient"))
    x = np.load(d / "buf.npy")
    low, plain = _reference(card, x, precision="bfloat16"), _reference(card, x)
    np.testing.assert_allclose(maps, low, rtol=0, atol=1e-6 * np.abs(low).max())
    assert not np.allclose(maps, plain, rtol=0, atol=1e-6 * np.abs(low).max())
    assert json.loads((out / "manifest.json").read_text())["config"]["precision"] == "bfloat16"
    with pytest.raises(SystemExit) as e:  # argparse's own refusal: usage and one error line
        main(args + ["--out", str(d / "cli_bad"), "--precision", "float16"])
    assert e.value.code == 2 and "--precision: invalid choice: 'float16'" in capsys.readouterr().err
    assert not (d / "cli_bad").exists()


def test_sweep_precision_key_reaches_the_engine(tiny, capsys):
    d, card = tiny
    cfg = d / "sweep.toml"
    cfg.write_text('agents = ["runs/tiny0.msgpack"]\ninputs = ["buf.npy"]\nprecision = "bfloat16"\n'
                   "[methods]\ngradient = {}\n")
    assert main(["sweep", str(cfg), "--out", str(d / "sweep_out"), "--quiet"]) == 0
    (job,) = (d / "sweep_out").rglob(sw.JOB)
    maps = np.asarray(jaxsal.load_maps(job, "gradient"))
    low = _reference(card, np.load(d / "buf.npy"), precision="bfloat16")
    np.testing.assert_allclose(maps, low, rtol=0, atol=1e-6 * np.abs(low).max())
    assert not np.allclose(maps, _reference(card, np.load(d / "buf.npy")), rtol=0, atol=1e-6 * np.abs(low).max())
    assert json.loads((job / "manifest.json").read_text())["config"]["precision"] == "bfloat16"
    cfg.write_text(cfg.read_text().replace('"bfloat16"', '"half"'))
    assert main(["sweep", str(cfg), "--out", str(d / "sweep_bad"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "precision: unknown precision 'half'; use one of float32, bfloat16" in err[0], err
