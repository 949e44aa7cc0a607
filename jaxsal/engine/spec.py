"""The method protocol: a `Spec` is a method's pure pieces and its options (optax-style), run by
the one engine `jaxsal.engine.run`.

The engine checks the call once (jaxsal.checks.check_call), asks `prepare` for the call's
constants, sizes the chunks, and per chunk of states traces one function: the greedy actions,
`chunk` once per group of the spec's inner loop (noise samples, path steps), summed, then
`finalize`. Specs whose `share_key`s agree run in one chunk function and read one `shared`
result (one forward/backward for several gradient and CAM methods).
"""
from __future__ import annotations

from typing import Callable, Hashable, NamedTuple

import jax
import jax.numpy as jnp


class Ctx(NamedTuple):
    """What every traced piece may use: the model, the target (jaxsal.targets.Target) and the
    call's layout ("NHWC"/"NCHW")."""
    apply_fn: Callable
    target: object
    layout: str


class Rows(NamedTuple):
    """One chunk of states as the traced pieces see it."""
    x: jax.Array        # (n, ...) float32 frames in the call's layout
    actions: jax.Array  # (n,) int32: the caller's actions, else the target's greedy choice
    index: jax.Array    # (n,) int32: each state's position in the call (noise keyed by state); None
                        # unless the spec is `indexed`
    extra: dict         # prepare's per-state arrays, chunked with the states


class Prepared(NamedTuple):
    """What `prepare` returns, once per call, on the host.

    static: hashable settings the traced pieces depend on (part of the compile-cache key);
    arrays: call-wide arrays (traced arguments: a baseline, a key); per_state: (N, ...) arrays
    chunked with the states (Rows.extra); groups: the inner loop, one pytree of equal-shaped
    arrays per group (None: no inner loop), whose chunk parts are summed; rows_per_state: model
    rows one state costs (samples per group x rows of a trunk run per frame), for chunk sizing;
    rows: the model rows per device call the method sized itself for when the caller gave no
    batch_size (None: the call's default).
    """
    static: Hashable
    arrays: object = ()
    per_state: dict = {}
    groups: tuple = (None,)
    rows_per_state: int = 1
    rows: int | None = None


def _identity_finalize(ctx, params, prep, rows, acc):
    return acc


class Spec(NamedTuple):
    """A method. Pieces (all pure; the traced ones see `prep` with traced arrays):

    prepare(call, apply_fn, params, **options) -> Prepared       host, once per call; checks options
    chunk(ctx, params, prep, rows, group, shared) -> part        traced, once per chunk and group
    finalize(ctx, params, prep, rows, acc) -> maps               traced, once per chunk (acc: summed parts)
    shared(ctx, params, preps, rows) -> value                    traced, once per chunk for a share group
    per_chunk(ctx, params, prep, rows) -> dict                   traced, once per chunk before its groups:
                                                                 per-state arrays (the clean output, a
                                                                 blurred copy) added to rows.extra
    share_key(options) -> (key, detail) or None                  calls with equal keys and details share
                                                                 (a detail None agrees with any)
    frames_only(call, options) -> options                        host, once for several calls on the same
                                                                 frames under other weights (the sanity
                                                                 check's draws): the options with the work
                                                                 that depends on the frames alone done
                                                                 (LIME's superpixels), so that no call
                                                                 repeats it or needs a host callback

    options: the method's own options and their defaults; example: tiny options for its generated
    conformance case; stochastic: needs key=; kind: what `chunk` gives, "gradient" (an input
    gradient in the call's layout: path_integral multiplies by x - x0), "input" (another
    input-shaped attribution), "maps" (final maps), "combined" (a combinator's) or
    "perturbation" (a table of perturbation scores: no combinator takes it); sums: optional fast weighted sums of the
    part over many inputs per state (jaxsal.backprop.pathavg), used by the combinators; indexed:
    its pieces read Rows.index; chooses: its shared piece runs the model on the clean frames and,
    given Rows.actions None, chooses them from that output (jaxsal.targets.greedy) and returns them
    as value["actions"]: the engine then runs no forward of its own for the choice (float32 calls
    without outputs=True). per_chunk: what every group of a chunk reads, computed once per chunk
    (in a program of its own ahead of an inner loop) instead of once per group.
    """
    name: str
    prepare: Callable
    chunk: Callable
    finalize: Callable = _identity_finalize
    options: dict = {}
    example: dict = {}
    stochastic: bool = False
    kind: str = "maps"
    shared: Callable | None = None
    share_key: Callable | None = None
    sums: object = None
    indexed: bool = False
    chooses: bool = False
    doc: str = ""
    per_chunk: Callable | None = None
    frames_only: Callable | None = None


class Sums(NamedTuple):
    """Weighted sums of a gradient spec's part over many inputs per state, exactly, faster than
    one chunk per input (the affine-prefix path of jaxsal.backprop.pathavg).

    samples(ctx, params, prep, x, xs, weights, actions, squares) -> (sum, sum of squares or None)
    path(ctx, params, prep, x0, x, alphas, weights, actions) -> sum_k w_k part(x0 + a_k (x - x0))
    """
    samples: Callable
    path: Callable


def objective(tgt, out, actions):
    """Per-sample target scores (N,) of the model output `out` for `actions` (no gradient
    flows into the actions)."""
    return tgt.score(out, jax.lax.stop_gradient(actions).astype(jnp.int32))

