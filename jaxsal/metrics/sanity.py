"""Sanity check by cascading parameter randomisation (Adebayo 2018, as in Paper B).

Layers are re-drawn from the model's own initialisers top-down and cumulatively; every
randomised model explains the same (original) chosen action on the same states with the same
PRNG key (so RISE reuses its masks), and each map is compared with the original map.
A trustworthy method's maps must change when the weights they claim to explain are destroyed.

Normalisation layers (the shipped PQN agents have a LayerNorm after every conv/dense layer,
named `<layer>_norm`; Paper B's agents had none). With `norms="with_layer"` (default) a
layer's norm is randomised together with it, i.e. re-drawn from its own initialiser, which for
flax's LayerNorm is the constant scale 1, bias 0: the norm is *reset to identity*, the same in
every draw. Why: the trained scale and bias of channel k were learned for trained feature k;
kept on top of random weights they would carry a learned per-channel gain pattern into a layer
that is supposed to know nothing, so "randomised up to conv3" would not be. The norm still
standardises the randomised layer's output, so downstream activations keep a trained-like
scale instead of vanishing or exploding, which a plain net's cascade can suffer from; this is
a difference from Paper B's LayerNorm-free agents. `norms="keep"` leaves the norms' trained
parameters in place (only the named layers change), as a literal reading of Adebayo et al.
Independent randomisation draws: `draw=d` re-draws the weights with another key (draw 0 is
the historical default); the method's own key (RISE masks, LIME samples) stays the same.
`draws=(...)` runs several draws in one call: for a perturbation method each cascade step's draws
run as one compiled program vmapped over their weights, so the layers the step leaves trained (the
trunk below the randomised ones) run once for all draws instead of once per draw; each draw's
result is the one `draw=d` gives (to float rounding).
"""
from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp

from jaxsal import registry, sizing
from jaxsal import targets as T
from jaxsal.errors import SaliencyInputError
from jaxsal.front import explain
from jaxsal.batching import map_batched
from jaxsal.caching import cached_jit
from jaxsal.metrics.similarity import METRICS, check_maps, similarity
from jaxsal.engine import expression
from jaxsal.registry import accepted_options
from jaxsal.checks import check_call, check_obs, check_positive_int, target_actions

DEFAULT_LAYERS = ("q", "fc1", "conv3", "conv2", "conv1")
BASELINES = ("random_uniform", "random_gaussian")
NORMS = ("with_layer", "keep")
NORM_SUFFIX = "_norm"


def _layer_names(params) -> set:
    names = set()
    for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]:
        for k in path:
            names.add(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))))
    return names


def _has_layer(path, layer: str) -> bool:
    return any(str(getattr(k, "key", getattr(k, "name", None))) == layer for k in path)


def _names(item) -> tuple:
    return (item,) if isinstance(item, str) else tuple(item)


def _label(item) -> str:
    return _names(item)[0]


def group_norms(params, layers, norms: str = "with_layer") -> tuple:
    """Pair each layer with its normalisation layer, so the two are randomised together.

    A plain name `l` becomes `(l, l + "_norm")` when the params tree has an `l_norm` module and
    `norms="with_layer"` (the module docstring says why); tuples stay as given.

    Args:
        params (PyTree): the model's parameters; only its key names are read.
        layers (Sequence[str | tuple[str, ...]]): layer names, or tuples of names randomised
            together, in cascade order.
        norms (str): "with_layer" (default) groups each layer with its `<layer>_norm`; "keep"
            returns `layers` unchanged (the norms stay trained).

    Returns:
        tuple: the entries of `layers`, each a name or a tuple of names.

    Raises:
        jaxsal.SaliencyInputError: `norms` is neither "with_layer" nor "keep".
    """
    if norms not in NORMS:
        raise SaliencyInputError(f"norms must be one of {list(NORMS)}, got {norms!r}")
    if norms == "keep":
        return tuple(layers)
    known = _layer_names(params)
    return tuple((item, item + NORM_SUFFIX) if isinstance(item, str) and item + NORM_SUFFIX in known
                 else item for item in layers)


def randomize_layers(params, fresh, layers) -> object:
    """`params` with the named layers' weights taken from `fresh` (a re-initialised copy).

    Every leaf under a key named in `layers` is replaced by the leaf of `fresh` at the same
    path; all other leaves stay as in `params`.

    Args:
        params (PyTree): the trained parameters.
        fresh (PyTree): parameters of the same tree structure, e.g. `model.init(key, x)`.
        layers (Sequence[str | tuple[str, ...]]): names of the layers to replace; a tuple entry
            names layers replaced together, e.g. `("conv1", "conv1_norm")`.

    Returns:
        PyTree: a params tree of the same structure as `params`.
    """
    layers = tuple(n for item in layers for n in _names(item))
    return jax.tree_util.tree_map_with_path(
        lambda path, p, f: f if any(_has_layer(path, l) for l in layers) else p, params, fresh)


def cascade(params, fresh, layers) -> list:
    """The cascade of cumulatively randomised models: entry i randomises layers[0..i].

    Args:
        params (PyTree): the trained parameters.
        fresh (PyTree): re-initialised parameters of the same tree structure.
        layers (Sequence[str | tuple[str, ...]]): layers in randomisation order (top-down for
            Adebayo's cascade); a tuple entry is randomised as one step.

    Returns:
        list[tuple[str, PyTree]]: `(label, params)` per entry of `layers`, where `params` has
            this entry and all earlier ones randomised; a tuple entry is labelled by its first name.
    """
    return [(label, randomize_layers(params, fresh, group)) for label, group in _steps(layers)]


def _steps(layers) -> list:
    """(label, layers randomised) of each cascade step: step i re-draws layers[0..i] (cumulative, in order)."""
    return [(_label(item), tuple(layers[:i + 1])) for i, item in enumerate(layers)]


def _draw_keys(key, draw: int):
    """(init, uniform baseline, Gaussian baseline) keys of one randomisation draw."""
    k_draw = jax.random.fold_in(key, 0x5A17)
    if draw:
        k_draw = jax.random.fold_in(k_draw, draw)
    return jax.random.split(k_draw, 3)


def free_memory_bytes() -> int | None:
    """Bytes free for new arrays on the default device: an accelerator's allocator limit less what it
    holds, on CPU the host's MemAvailable (Linux); None where neither is known."""
    stats = None
    try:
        stats = jax.devices()[0].memory_stats()
    except Exception:  # noqa: BLE001 - a backend without memory statistics (XLA:CPU)
        pass
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def draws_that_fit(params) -> int | None:
    """How many draws one call may hold: each is a re-drawn copy of the weights, all held at once,
    and together they may take half the free memory (free_memory_bytes); None where that is unknown."""
    per_copy = sum(int(jnp.size(a)) * jnp.dtype(jnp.result_type(a)).itemsize for a in jax.tree.leaves(params))
    free = free_memory_bytes()
    if not per_copy or free is None:
        return None
    return max(1, free // 2 // per_copy)


def _check_draws(draw, draws, limit: int | None = None) -> tuple:
    """The draws one call computes, checked: `draw` alone, or the sequence `draws`, at most `limit`
    of them (each holds a copy of the weights: draws_that_fit)."""
    draw = check_positive_int("draw", draw, 0)
    if draws is None:
        return (draw,)
    if draw:
        raise SaliencyInputError(f"pass either draw= (one draw) or draws= (several), not both (got draw={draw})")
    if isinstance(draws, (str, bytes)) or not hasattr(draws, "__iter__"):
        raise SaliencyInputError(f"draws must be a sequence of draw indices, e.g. range(10), got {draws!r}")
    if limit is not None:
        try:
            n = len(draws)
        except OverflowError:  # range(2**64): more than any machine holds
            n = limit + 1
        except TypeError:  # an iterator: read no more than the limit and one
            draws = tuple(itertools.islice(draws, limit + 1))
            n = len(draws)
        if n > limit:
            raise SaliencyInputError(
                f"draws holds {n if n <= 2 ** 63 else 'more than 2**63'} draws, each a re-drawn copy of the "
                f"weights held at once, but this machine's free memory holds about {limit}; pass at most {limit} "
                f"per call (e.g. draws=range(0, {min(limit, 10)}), then the next indices in another call)")
    out = tuple(check_positive_int("draws", d, 0) for d in draws)
    if not out:
        raise SaliencyInputError("draws is empty; pass at least one draw index, e.g. draws=range(10)")
    if len(set(out)) != len(out):
        raise SaliencyInputError(f"draws has repeated indices {sorted(d for d in set(out) if out.count(d) > 1)}")
    return out


def _vmapped(maps_of, stack, x, params):
    """maps_of(weights, x, params) vmapped over the stacked draws' weights: the layers a cascade step
    leaves trained are unbatched, so they run once for all draws. One compiled program where the
    method traces, the frames and the trained parameters arguments of it (closed over, they were
    constants XLA spent seconds folding: 9 s for one reduce-window of LIME's sanity step); an eager
    vmap dispatches the incremental pass op by op (measured 8x slower). Eagerly where the method
    needs the frames' values on the host (LIME's quickshift and Felzenszwalb segment them there, and
    cannot under a trace without a `max_segments` bound) or reads a value to decide."""
    try:
        program = jax.jit(jax.vmap(maps_of, in_axes=(0, None, None))).lower(stack, x, params).compile()
    except (SaliencyInputError, jax.errors.ConcretizationTypeError):  # needs values: a host step, a check
        return jax.vmap(lambda f: maps_of(f, x, params))(stack)
    return program(stack, x, params)


def _module_init(model):
    return model.init


def _chooser(apply_fn, tgt):
    return lambda p, o: T.greedy(tgt, apply_fn(p, o))


def _resolve_model(model, apply_fn, obs):
    if hasattr(model, "init") and hasattr(model, "apply"):
        init = cached_jit(_module_init, model)  # compiled once per module: eager flax init
        # of a Nature CNN takes seconds
        dummy = jnp.zeros_like(obs[:1])
        return (apply_fn or model.apply), (lambda k: init(k, dummy))
    if callable(model):
        if apply_fn is None:
            raise SaliencyInputError(
                "sanity_check got an init function (key -> params) as `model`; also pass "
                "apply_fn=apply_fn(params, obs), or pass the flax module itself as `model`")
        return apply_fn, model
    raise SaliencyInputError(
        f"model must be a flax module (with .init/.apply) or an init_fn(key) -> params, "
        f"got {type(model).__name__}")


def sanity_check(model, params, obs, method="gradient", layers=DEFAULT_LAYERS, key=None, *,
                 target="q_chosen", actions=None, apply_fn=None, layout: str | None = None,
                 batch_size: int | None = None, metrics=METRICS, similarity_batch_size: int | None = None,
                 return_maps: bool = False, norms: str = "with_layer", draw: int = 0,
                 draws=None, original=None, **method_options):
    """Cascading randomisation sanity check (Adebayo 2018) of `method` on states `obs`.

    A trustworthy method's maps change when the weights they explain are destroyed: layers are
    re-drawn from the model's own initialisers top-down and cumulatively, and each randomised
    model's maps are compared with the original maps (Paper B's inverted-max similarities).
    Every model explains the original model's chosen action (for a named target) with the same
    method key.

    Args:
        model (flax.linen.Module | Callable): a flax module (its `init` gives the fresh weights,
            its `apply` the agent) or an `init_fn(key) -> params`, which then needs `apply_fn=`.
        params (PyTree): the trained parameters.
        obs (jax.Array | numpy.ndarray): states (N, H, W, C), or (N, C, H, W) with
            `layout="NCHW"`.
        method (str | jaxsal.engine.Spec): a registered method name (`jaxsal.methods()`), a method
            expression such as "noise_tunnel(gradcam, n=16)" (jaxsal.engine.expression) or a spec.
        layers (Sequence[str | tuple[str, ...]]): the layers randomised, in order (a name or a
            tuple of names randomised together, labelled by its first name, e.g.
            `("conv1", "conv1_norm")`). Defaults to the Nature CNN's
            ("q", "fc1", "conv3", "conv2", "conv1").
        key (jax.Array): PRNG key; seeds the re-initialisation, the baselines and (unchanged for
            every model) the method's own randomness. Required.
        target (str | Callable): what is explained, as in `jaxsal.explain`.
        actions (jax.Array | None): (N,) actions to explain; None: a named target's choice on
            the original model, fixed once for every model (a callable target or "value"
            resolves its own per model).
        apply_fn (Callable | None): `apply_fn(params, obs)`; None uses `model.apply`.
        layout (str | None): "NHWC" or "NCHW"; None: the model's declared layout, else NHWC.
        batch_size (int | None): model rows per forward pass of the method and of the
            original model's action choice (None: the backend's default).
        metrics (Sequence[str]): similarity metrics, from ("spearman", "ssim_flat", "ssim",
            "hog"). Defaults to all four.
        similarity_batch_size (int | None): map pairs compared at once (a memory knob);
            None: as many as `batch_size` rows.
        return_maps (bool): also return every model's maps under "maps".
        norms (str): "with_layer" (default) randomises a layer's `<layer>_norm` with it
            (a LayerNorm is reset to identity); "keep" leaves the norms trained (the module
            docstring says why the default).
        draw (int): index of an independent randomisation draw (other re-initialised weights
            and baselines, the same method key); draw 0 is the key's own.
        draws (Sequence[int] | None): several draw indices computed in one call, each giving
            what `draw=` would. A perturbation method's draws of a cascade step then run as
            one program (compiled per call, seconds) sharing the layers the step leaves
            trained: for 10 draws 1.0-1.2x at the last step and 1.5-13x at the others
            (occlusion, RISE, noise sensitivity); memory grows with the number of draws:
            at most as many as half the free memory holds copies of the weights.
            Gradient methods run their draws one at a time. None: the one `draw`.
        original (jax.Array | None): the method's maps (N, H, W) of `obs` under `params` when
            the caller already has them (same options and key, e.g. one set shared by every
            draw); None computes them.
        **method_options (Any): further options of `method` (e.g. `n_masks` for RISE).

    Returns:
        dict: `{label: {metric: jax.Array (N,)}}` for each entry of `layers`, plus
            "random_uniform" and "random_gaussian" (the original maps against U(0, 1) and
            N(0, 1) maps: the floor a method should reach) and, with `return_maps=True`,
            "maps": `{"original": (N, H, W), label: (N, H, W), ...}`. With `draws=`:
            `{draw: that dict}` per draw, in the order given.

    Raises:
        jaxsal.SaliencyInputError: `key` is missing; `layers` is empty, holds non-names, names a
            layer the params tree lacks or clashes with a result key; `draw` is not a
            non-negative int, `draws` not a non-empty sequence of distinct ones or more than
            half the free memory holds, or both are given; `per_frame=True` is asked for;
            `model` is neither a flax module nor an init function (or is one without
            `apply_fn`); `init_fn` returns another tree than `params`; `original` does not fit
            `obs`; or `obs` or the options are invalid.
    """
    if key is None:
        raise SaliencyInputError("sanity_check needs key=jax.random.PRNGKey(seed): it seeds the "
                                 "re-initialised layers, the baselines and the method's masks")
    if isinstance(layers, str):
        layers = (layers,)
    layers = tuple(layers)
    todo = _check_draws(draw, draws, None if draws is None else draws_that_fit(params))
    if not layers:
        raise SaliencyInputError("layers is empty; name at least one layer, e.g. ('q', 'fc1')")
    if not all(isinstance(n, str) for item in layers for n in _names(item)):
        raise SaliencyInputError(f"layers must be names or tuples of names, got {layers!r}")
    clash = [_label(l) for l in layers if _label(l) in BASELINES + ("maps",)]
    if clash:
        raise SaliencyInputError(f"layer names {clash} clash with result keys {BASELINES + ('maps',)}")
    if method_options.get("per_frame"):
        raise SaliencyInputError("sanity_check compares 2-D maps; per_frame=True is not supported")
    method = expression.parse(method) if isinstance(method, str) else method
    fn = expression.function(method)
    name = getattr(method, "name", method)
    rows = sizing.rows(batch_size)
    pairs = rows if similarity_batch_size is None else similarity_batch_size
    x = check_obs(obs, layout or "NHWC")
    layers = group_norms(params, layers, norms)
    apply_fn, init_fn = _resolve_model(model, apply_fn, x)
    known = _layer_names(params)
    missing = [n for item in layers for n in _names(item) if n not in known]
    if missing:
        raise SaliencyInputError(f"layers {missing} are not in the params tree; it has "
                                 f"{sorted(n for n in known if not n.startswith('params'))}")

    if actions is None and isinstance(target, str) and target != "value":
        tgt = T.get_target(target)
        target_actions(tgt, None, x.shape[0], None)  # q_action: the caller's actions are needed
        choose = cached_jit(_chooser, apply_fn, tgt)
        actions = map_batched(choose, params, x, batch_size=rows)   # fixed once, original model

    keys = {d: _draw_keys(key, d) for d in todo}
    fresh = {d: init_fn(keys[d][0]) for d in todo}
    for f in fresh.values():
        try:
            jax.tree.map(lambda a, b: None, params, f)
        except ValueError:
            raise SaliencyInputError("init_fn(key) returned params whose tree differs from `params`; "
                                     "is it the same architecture and action count?") from None

    opts = dict(method_options, target=target, batch_size=batch_size)
    if layout is not None:  # else the method resolves the model's declared layout
        opts["layout"] = layout
    if actions is not None:
        opts["actions"] = actions
    if "key" in accepted_options(fn):
        opts["key"] = key
    spec = registry.SPECS.get(method) if isinstance(method, str) else None
    if getattr(spec, "frames_only", None) is not None:  # e.g. LIME's superpixels: segmented once, not per draw
        opts = spec.frames_only(check_call(apply_fn, params, x, target=target, actions=actions, layout=layout,
                                           batch_size=batch_size), opts)

    def raw_maps(p, frames=x):
        return explain(apply_fn, p, frames, method=method, **opts)

    def maps_of(p):
        return check_maps(raw_maps(p), f"{name} maps")

    if original is None:
        original = maps_of(params)
    else:
        original = check_maps(jnp.asarray(original, jnp.float32), "original maps")
        if original.shape[0] != x.shape[0]:
            raise SaliencyInputError(f"original maps are {original.shape[0]} maps for {x.shape[0]} states: "
                                     "pass the maps of `obs` itself")
    # perturbation methods share the trained layers' forward passes between draws; a gradient method's
    # backward through re-drawn convolutions runs them grouped when vmapped (IG measured 0.8x): one at a time
    batched = getattr(method if not isinstance(method, str) else registry.SPECS.get(method), "kind", None) \
        == "perturbation"
    all_maps = {d: {"original": original} for d in todo}
    for label, group in _steps(layers):
        if len(todo) > 1 and batched:
            stack = jax.tree.map(lambda *a: jnp.stack(a), *(fresh[d] for d in todo))
            ms = _vmapped(lambda f, frames, p, group=group: raw_maps(randomize_layers(p, f, group), frames),
                          stack, x, params)
            per_draw = {d: check_maps(m, f"{name} maps") for d, m in zip(todo, ms)}
        else:
            per_draw = {d: maps_of(randomize_layers(params, fresh[d], group)) for d in todo}
        for d, m in per_draw.items():
            if m.shape != original.shape:
                raise SaliencyInputError(f"original maps have shape {tuple(original.shape)}, but {name} "
                                         f"gives {tuple(m.shape)} on these states: pass the maps of `obs` itself")
            all_maps[d][label] = m
    results = {}
    for d in todo:
        _, k_uni, k_gauss = keys[d]
        # one call per draw: the original maps' ranks, HOG features and box means are computed once
        # for all the maps they are compared with
        others = {label: m for label, m in all_maps[d].items() if label != "original"}
        others["random_uniform"] = jax.random.uniform(k_uni, original.shape)
        others["random_gaussian"] = jax.random.normal(k_gauss, original.shape)
        sims = similarity(original, jnp.stack(list(others.values())), metrics, batch_size=pairs)
        result = {label: {k: v[i] for k, v in sims.items()} for i, label in enumerate(others)}
        if return_maps:
            result["maps"] = all_maps[d]
        results[d] = result
    return results if draws is not None else results[todo[0]]
