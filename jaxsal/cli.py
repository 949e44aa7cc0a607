"""The `jaxsal` command: explain replay buffers in batch, render galleries and videos, run the demo.

    jaxsal explain --agent breakout --methods gradcam,rise --input buffer.npz --out maps/
    jaxsal render maps/
    jaxsal sweep sweep.toml --out runs/sweep/
    jaxsal demo
    jaxsal agents

Every bad input ends in one line on stderr and a non-zero exit, never a traceback
(set JAXSAL_DEBUG=1 to see one).
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from jaxsal.batching import LRU

EXIT_INPUT, EXIT_INTERNAL, EXIT_INTERRUPT, EXIT_TERM = 2, 1, 130, 143
DEMO_METHODS = ("gradcam", "guided_backprop", "gradient", "occlusion")
DEMO_OPTIONS = {"gradcam": {"layer": "conv3"}, "occlusion": {"patch": 6, "stride": 6, "score": "drop"}}


class CLIError(Exception):
    """A user error found by the command line itself."""


def _die(msg: str, code: int = EXIT_INPUT):
    print(f"jaxsal: error: {msg}", file=sys.stderr)
    return code


def _say(msg: str, quiet: bool = False):
    if not quiet:
        print(msg, flush=True)


# --------------------------------------------------------------------------- parsing
def parse_methods(text: str) -> list[tuple[str, str]]:
    """'gradcam,critic=occlusion' -> [(alias, method), ...]."""
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        alias, _, method = item.partition("=")
        out.append((alias.strip(), (method or alias).strip()))
    if not out:
        raise CLIError("--methods is empty; e.g. --methods gradcam,gradient")
    return out


def parse_value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return {"true": True, "false": False, "none": None}.get(text.lower(), text)


def parse_options(items, aliases) -> dict[str, dict]:
    """['rise.n_masks=500', ...] -> {'rise': {'n_masks': 500}}."""
    opts = {a: {} for a in aliases}
    for item in items or []:
        name, eq, value = item.partition("=")
        method, dot, key = name.partition(".")
        if not eq or not dot or not key:
            raise CLIError(f"--option {item!r}: use METHOD.NAME=VALUE, e.g. rise.n_masks=500")
        if method not in opts:
            raise CLIError(f"--option {item!r} is for {method!r}, which is not in --methods "
                           f"({', '.join(aliases)})")
        opts[method][key] = parse_value(value)
    return opts


# --------------------------------------------------------------------------- agents
AGENT_HELP = ("shipped agent name (see `jaxsal agents`), an agent card .json, a checkpoint file "
              "(.cleanrl_model, torch .pth/.pt, Stable-Baselines3 .zip), or path/to/file.py:FUNCTION / "
              "package.module:FUNCTION where FUNCTION() returns an object with apply_fn and params "
              "(optionally layout, name, num_actions) or a tuple (apply_fn, params)")


def load_agent(name: str, model: str | None = None, layout: str | None = None):
    """The agent of an --agent SPEC as a jaxsal.agent_spec.LoadedAgent: a shipped name or card
    (params beside it or given by --model), a .msgpack with its card beside it, a checkpoint
    file of another library (jaxsal.loaders), or FILE.py:FUNCTION / package.module:FUNCTION."""
    from jaxsal.agent_spec import as_agent, is_function_spec, load_function_spec
    from jaxsal.loaders import FILE_SUFFIXES, load_file

    if model is not None and not Path(model).exists():
        raise CLIError(f"--model {model} does not exist")
    if is_function_spec(name):
        if model is not None:
            raise CLIError("--model is for shipped agents and cards; FUNCTION() loads its own parameters")
        return load_function_spec(name, layout)
    if Path(name).suffix in FILE_SUFFIXES:
        return as_agent(load_file(name), layout=layout, where=f"--agent {name}")
    from jaxsal.plugins import agent_provider

    provider = agent_provider()  # shipped names and cards come from the installed agents package
    if name.endswith(".msgpack"):
        card = Path(name).with_suffix(".json")
        if not card.exists():
            raise CLIError(f"--agent {name}: no agent card {card.name} beside it; give --agent CARD.json "
                           f"--model {name}, or a shipped agent name with --model")
        a = provider.load(str(card), params_path=model or name)
    else:
        if not name.endswith(".json") and name not in provider.available():
            raise CLIError(f"unknown agent {name!r}: give a shipped name ({', '.join(provider.available())}), "
                           "a card .json, a checkpoint (.cleanrl_model/.pth/.zip) or path/to/file.py:FUNCTION")
        a = provider.load(name, params_path=model)
    return as_agent(a, default_name=a.name, layout=layout, where=f"--agent {name}")


def _game_agent(agent):
    """An agent object for the provider's collect (NHWC frames), whatever the model's layout."""
    import types

    fn = agent.apply_fn
    if agent.layout == "NCHW":
        def fn(params, x, _f=agent.apply_fn):
            return _f(params, x.transpose(0, 3, 1, 2))
    return types.SimpleNamespace(apply_fn=fn, params=agent.params, name=agent.name,
                                 num_actions=agent.num_actions, game=agent.card.get("game"))


def _check_frames(agent, shape):
    """Frames (in the model's layout) must have the shape the agent's card says."""
    from jaxsal.io.layout import to_nhwc_shape

    want = tuple(agent.card.get("obs_shape", ()))
    if want and len(shape) == 4:
        got_hwc = to_nhwc_shape(shape, agent.layout)[1:]
        want_hwc = to_nhwc_shape((1,) + want, agent.layout)[1:]
        if got_hwc != want_hwc:
            raise CLIError(f"input frames have shape {tuple(shape[1:])} but agent {agent.name!r} expects "
                           f"{want} ({agent.layout}); was the buffer recorded for another game or preprocessing?")


def _check_buffer_actions(agent, source, num_actions):
    """A Dopamine buffer's stored actions must be actions of this agent (jaxsal.checks.check_actions):
    one the agent does not have means agent and buffer are for different games. (The actions
    `--target q_action` explains, from any buffer, are checked by the job before it writes.)"""
    from jaxsal.checks import check_actions
    from jaxsal.errors import SaliencyInputError
    from jaxsal.io.readers import DopamineSource

    if num_actions is None or not isinstance(source, DopamineSource):
        return
    for part in source.parts:
        path = part.action_path
        if path.exists():
            actions = part.actions(0, len(part))  # the states served: slots never written hold garbage
            try:
                check_actions(actions, len(actions), num_actions)
            except SaliencyInputError as e:
                raise CLIError(f"{path.name}: {e}: agent {agent.name!r} and the buffer are for different "
                               "games") from None


def _check_numbers(args):
    """The numeric options, before the agent is loaded."""
    for flag, value in (("--batch-size", args.batch_size), ("--chunk", args.chunk), ("--limit", args.limit),
                        ("--num-processes", args.num_processes)):
        if value is not None and value < 1:
            raise CLIError(f"{flag} must be a positive integer, got {value}"
                           + {"--batch-size": " (model rows per device call, e.g. --batch-size 256)",
                              "--chunk": " (frames per output chunk, e.g. --chunk 512)",
                              "--limit": " (explain only the first N frames)"}.get(flag, ""))


def _other_layout(layout: str) -> str:
    return "NCHW" if layout == "NHWC" else "NHWC"


def _check_model(agent, shape, layout_given: str | None, target: str | None = None):
    """The library's model check (jaxsal.checks.check_model: one abstract forward pass, no
    compilation) on a frame stack of `shape` (model layout), before anything is written, in the
    CLI's words: a model that takes the other layout or fails on these frames, or a target its
    output cannot give (e.g. value on a Q-network). Returns the output shapes."""
    from jaxsal import checks

    try:
        return checks.check_model(agent.apply_fn, agent.params, shape, layout=agent.layout,
                                  target=target or "q_chosen")
    except checks.ModelFails as e:
        error = e.error.partition(":")[0]
        if e.layout is not None:
            fix = f"add --layout {e.layout}" if layout_given is None else f"use --layout {e.layout}"
            raise CLIError(f"agent {agent.name!r} takes {checks.KINDS[e.layout]} frames (N, {', '.join(map(str, e.alt_shape[1:]))}): "
                           f"{fix} (on {checks.KINDS[agent.layout]} frames {e.shape} it fails: {error})") from None
        _check_frames(agent, shape)  # frames of another size than the card's: that says it best
        raise CLIError(f"agent {agent.name!r} fails on one frame stack of shape {e.shape} ({agent.layout}): {e.error}; "
                       "check that --agent and --input (and --layout) belong together") from None
    except checks.TargetFails as e:
        raise CLIError(f"--target {target}: {e}; choose another --target (see jaxsal explain --help)") from None


def _check_layers(agent, specs, source):
    """Layers named with --option M.layer=NAME must exist in the model and be spatial."""
    from jaxsal.errors import SaliencyInputError
    from jaxsal.backprop.layers import resolve_layer
    from jaxsal.registry import accepted_options, get_method

    x = None
    for s in specs:
        layer = s.options.get("layer")
        if layer is None or "layer" not in accepted_options(get_method(s.method)):
            continue
        if x is None:
            x = np.zeros((1,) + tuple(source.shape[1:]), np.float32)
        try:
            resolve_layer(agent.apply_fn, agent.params, x, layer)
        except SaliencyInputError as e:
            raise CLIError(f"--option {s.alias}.layer={layer}: {e}") from None


def play(agent, steps: int, out: Path, game: str | None = None, seed: int = 0, until_done: bool = False,
         quiet: bool = False, target: str | None = None, layout_given: str | None = None):
    """Play `steps` steps with the agents provider's game (EnvPool / gymnax) and save the frames as
    out/input/obs.npy (reused on rerun). The model is checked on the game's frames (layout, `target`)
    before playing."""
    from jaxsal.checks import num_actions
    from jaxsal.io import open_source
    from jaxsal.plugins import agent_provider
    from jaxsal.io.store import MANIFEST

    path = Path(out).absolute() / "input" / "obs.npy"  # recorded in the manifest: render finds it from anywhere
    if (out / MANIFEST).exists() and path.exists():
        _say(f"reusing the rollout saved in {path}", quiet)
        return open_source(path)
    if steps < 1:
        raise CLIError(f"--play needs a positive number of steps, got {steps}")
    provider = agent_provider()
    game = provider.check_game(game or agent.card.get("game") or "breakout")
    env = provider.make_env(game, seed=seed)
    shape = (1,) + tuple(env.obs_shape)
    model_shape = shape if agent.layout == "NHWC" else (1, shape[3], shape[1], shape[2])
    model_out = _check_model(agent, model_shape, layout_given, target)
    n_act = agent.num_actions or num_actions(model_out)
    if n_act is not None and env.num_actions != n_act:
        raise CLIError(f"agent {agent.name!r} has {n_act} actions but {game} has "
                       f"{env.num_actions}: choose the agent trained on {game}")
    _check_frames(agent, model_shape)
    t = time.perf_counter()
    batch = provider.collect(_game_agent(agent), steps, env=env, seed=seed, until_done=until_done)
    _say(f"played {len(batch)} steps of {game} in {time.perf_counter() - t:.1f}s "
         f"(returns of finished games: {batch.episode_returns or 'none finished'})", quiet)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(".obs.npy.tmp")
    with open(tmp, "wb") as f:  # a file handle: np.save(path) would append ".npy" to the name
        np.save(f, np.asarray(batch.obs, np.uint8))
    os.replace(tmp, path)
    return open_source(path)


# --------------------------------------------------------------------------- commands
def _init_distributed(args):
    if args.num_processes == 1:
        return
    if not args.coordinator:
        raise CLIError("--num-processes > 1 needs --coordinator HOST:PORT (the address of process 0)")
    if args.process_id is None or not 0 <= args.process_id < args.num_processes:
        raise CLIError(f"--process-id must be in [0, {args.num_processes})")
    import jax

    try:
        jax.distributed.initialize(args.coordinator, num_processes=args.num_processes,
                                   process_id=args.process_id, initialization_timeout=120)
    except Exception as e:  # connection problems come as many types
        raise CLIError(f"cannot join the job at {args.coordinator} as process {args.process_id} of "
                       f"{args.num_processes}: {str(e).splitlines()[0]}") from None


def _summary_lines(summary: dict) -> list[str]:
    steady = summary.get("maps_per_s_after_compile", {})
    rates = ", ".join((f"{k} {v:.1f}" if v else f"{k} -") + (f" ({steady[k]:.1f} after compile)"
                                                              if steady.get(k) else "")
                      for k, v in summary["maps_per_s"].items())
    lines = [f"frames: {summary['frames']} in the buffer, {summary['frames_computed']} computed now"
             + (f", {summary['frames_resumed']} already done" if summary["frames_resumed"] else "")
             + (f" (process {summary['process_id']} of {summary['num_processes']})"
                if summary["num_processes"] > 1 else ""),
             f"maps/s per method: {rates}",
             f"wall time: {summary['wall_s']:.1f}s on {summary['devices']} device(s)",
             f"output: {summary['out']}" + ("" if summary["complete"] else " (incomplete: other processes "
                                                                              "still running, or rerun)")]
    return lines


def cmd_explain(args) -> int:
    from jaxsal.io import MethodSpec
    from jaxsal.io.job import check_specs

    pairs = parse_methods(args.methods)
    opts = parse_options(args.option, [a for a, _ in pairs])
    specs = [MethodSpec(a, m, opts[a]) for a, m in pairs]
    check_specs(specs)
    if (args.input is None) == (args.play is None):
        raise CLIError("give exactly one of --input PATH or --play STEPS")
    if args.objects is not None and args.play is not None:
        from jaxsal.io.objects import RECORD_HINT
        raise CLIError("--objects needs frames with known boxes; --play records with EnvPool, which has no RAM. "
                       f"Record with ale-py instead: {RECORD_HINT}, then jaxsal explain --input DIR/obs.npy --objects")
    if args.store == "shares" and args.objects is None:
        raise CLIError("--store shares keeps only the object shares: add --objects [FILE]")
    if args.effects and args.objects is None:
        from jaxsal.io.objects import EFFECTS_NEED_OBJECTS
        raise CLIError(EFFECTS_NEED_OBJECTS)
    if args.play is not None and args.num_processes > 1:
        raise CLIError("--play records one rollout: run it with one process, then explain its "
                       "OUT/input/obs.npy with --input on several processes")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise CLIError(f"--out {out} exists and is not a directory")
    from jaxsal.targets import get_target

    _check_numbers(args)  # before the agent is loaded: cheap mistakes first
    get_target(args.target)  # an unknown target: before the agent is loaded
    _init_distributed(args)  # before the first JAX computation (loading the agent)
    agent = load_agent(args.agent, args.model, args.layout)
    before = _snapshot(out)
    try:
        summary = _explain_job(args, agent, specs, out)
    except KeyboardInterrupt as e:  # what is saved, for the one line main() prints
        if (out / "manifest.json").exists():
            e.jaxsal_saved = _saved(out, specs)
        raise
    except BaseException:
        if args.num_processes == 1:  # nobody else writes here: take back what this run created
            _take_back(out, before)
        raise
    for line in _summary_lines(summary):
        _say(line, args.quiet)
    if args.objects is not None and summary["complete"]:
        from jaxsal.io.objects import summary_lines

        for line in summary_lines(out, [a for a, _ in pairs], effects=args.effects):
            _say(line, args.quiet)
    return 0


def _explain_job(args, agent, specs, out: Path):
    """Open the input, check everything that can be checked before writing, run the job."""
    import jaxsal
    from jaxsal.checks import NonFinite, num_actions
    from jaxsal.io import open_source, run_job
    from jaxsal.io.layout import as_layout
    from jaxsal.io.readers import verify_input

    if args.play is not None:
        source = play(agent, args.play, out, game=args.game, seed=args.seed, quiet=args.quiet, target=args.target,
                      layout_given=args.layout)
        input_id = {"play": args.play, "game": args.game or agent.card.get("game"), "seed": args.seed}
    else:
        source = open_source(Path(args.input).absolute())  # the manifest records where it is, from anywhere
        verify_input(source)  # every member's checksum, before any frame is looked at
        input_id = None
    source = as_layout(source, agent.layout)  # (N, 84, 84, 4) or (N, 4, 84, 84): the model's layout
    model_out = _check_model(agent, source.shape, args.layout, args.target)
    _check_frames(agent, source.shape)
    _check_buffer_actions(agent, source, agent.num_actions or num_actions(model_out))
    objects, store_maps = _objects_for(args, agent, source)
    if args.limit is not None:
        source = _Limited(source, args.limit)
    _check_layers(agent, specs, source)
    _say(f"explaining {len(source)} frames of {source.describe().get('path') or 'the rollout'} with "
         f"{', '.join(s.alias for s in specs)} (agent {agent.name}, {jaxsal.__version__})", args.quiet)
    try:
        return run_job(agent.apply_fn, agent.params, source, out, specs, target=args.target, chunk=args.chunk,
                       batch_size=args.batch_size, dtype=args.dtype, seed=args.seed,
                       agent={"name": agent.name, "card": agent.card}, input_id=input_id,
                       process_id=args.process_id or 0, num_processes=args.num_processes, quiet=args.quiet,
                       layout=agent.layout, extra_meta={"input_layout": source.describe().get("layout", agent.layout)},
                       objects=objects, store_maps=store_maps)
    except NonFinite as e:  # the frames before the first bad one can be explained on their own
        raise CLIError(f"{e}, or explain the frames before it with --limit {e.index}" if e.index else str(e)) from None


def _snapshot(out: Path):
    """The paths under `out` before the job (None: it did not exist)."""
    return set(out.rglob("*")) if out.is_dir() else None


def _take_back(out: Path, before):
    """After a failed start: remove what this run created under `out` (the directory too when this run
    created it), unless the run finished a chunk (then everything stays, and a rerun resumes).
    Nothing that was there before is touched."""
    if not out.is_dir():
        return
    new = [p for p in out.rglob("*") if before is None or p not in before]
    if any(p.name.startswith("chunk_") and p.is_file() for p in new):
        return
    try:
        for p in sorted(new, key=lambda q: len(q.parts), reverse=True):
            if p.is_dir() and not p.is_symlink():
                p.rmdir()  # only empty directories: everything in them is new too
            else:
                p.unlink()
        if before is None:
            out.rmdir()
    except OSError:
        pass  # best effort: the error being reported matters more


def _saved(out: Path, specs) -> str:
    """'K of M chunks are saved in OUT' for a stopped job."""
    from jaxsal.io import store

    try:
        cfg = store.read_manifest(out)["config"]
        n_chunks = -(-int(cfg["n"]) // int(cfg["chunk"]))
        maps = cfg.get("store") != "shares"
        from jaxsal.io.objects import effects_path

        effects = "effects" in cfg.get("objects", {})
        done = sum(store.outputs_path(out, i).exists()
                   and (not maps or all(store.chunk_path(out, s.alias, i).exists() for s in specs))
                   and (not effects or effects_path(out, i).exists())
                   for i in range(n_chunks))
    except Exception:  # noqa: BLE001 (the message is a courtesy)
        return f"finished chunks are kept in {out}"
    return f"{done} of {n_chunks} chunks are saved in {out}"


def _objects_for(args, agent, source):
    """--objects [FILE] / --store: the boxes of the input's frames (jaxsal.io.objects) and whether
    the maps are stored too."""
    from jaxsal.io.layout import to_nhwc_shape
    from jaxsal.io.objects import for_job

    objects = args.objects if args.objects in (None, "auto") else str(Path(args.objects).absolute())
    where = None if args.input is None else str(Path(args.input).absolute())
    return for_job(objects, args.store, where, agent.card.get("game"), len(source),
                   to_nhwc_shape(source.shape, agent.layout), args.limit, effects=args.effects)


class _Limited:
    """The first `n` frames of a source (for quick tries on a big buffer)."""

    def __init__(self, source, n: int):
        if n < 1:
            raise CLIError(f"--limit must be positive, got {n}")
        self.source, self.n = source, min(n, len(source))
        if hasattr(source, "actions"):
            self.actions = lambda a, b: source.actions(a, min(b, self.n))
        if hasattr(source, "row_ids"):
            self.row_ids = lambda a, b: source.row_ids(a, min(b, self.n))

    def __len__(self):
        return self.n

    @property
    def shape(self):
        return (self.n,) + tuple(self.source.shape[1:])

    def read(self, a, b):
        return self.source.read(a, min(b, self.n))

    def fingerprint(self):
        return f"{self.source.fingerprint()}[:{self.n}]"

    def describe(self):
        return dict(self.source.describe(), limit=self.n)


def _frame_range(text: str | None):
    if not text:
        return 0, None
    a, _, b = text.partition(":")
    try:
        return int(a or 0), (int(b) if b else None)
    except ValueError:
        raise CLIError(f"--frames {text!r}: use START:STOP, e.g. 0:400") from None


def cmd_render(args) -> int:
    from jaxsal.render import render_dir
    from jaxsal.render_sweep import is_sweep_dir, render_sweep

    start, stop = _frame_range(args.frames)
    if is_sweep_dir(args.dir):  # a `jaxsal sweep` DIR: metric curves and a grid of one frame per cell
        t = time.perf_counter()
        res = render_sweep(args.dir, gallery=args.out, methods=args.methods.split(",") if args.methods else None,
                           frame=start, scheme=args.scheme, scale=args.scale)
        _say(f"rendered the sweep's curves ({len(res['panels'])} panels) and grid ({len(res['grid'].rows)} rows x "
             f"{len(res['grid'].methods)} methods) in {time.perf_counter() - t:.1f}s; open {res['html']}", args.quiet)
        return 0
    frames = None
    if args.input:
        from jaxsal.io import open_source
        from jaxsal.io.readers import verify_input

        src = open_source(args.input)
        verify_input(src)  # frames of corrupt bytes would be drawn as the job's
        frames = src.read(0, min(len(src), stop or len(src)))
    videos = () if args.video == "none" else tuple(v.strip() for v in args.video.split(",") if v.strip())
    for v in videos:
        if v not in ("mp4", "gif"):
            raise CLIError(f"--video {args.video!r}: use mp4, gif, mp4,gif or none")
    grey = tuple(args.greydanus.split(",")) if args.greydanus else None
    if grey is not None and len(grey) != 2:
        raise CLIError("--greydanus takes two names: ACTOR,CRITIC")
    t = time.perf_counter()
    res = render_dir(args.dir, methods=args.methods.split(",") if args.methods else None, gallery=args.out,
                     frames=frames, start=start, stop=stop, grid_frames=args.grid_frames, videos=videos,
                     scheme=args.scheme, fps=args.fps, scale=args.scale, greydanus=grey,
                     objects=args.objects, boxes=not args.no_boxes)
    _say(f"rendered {len(res['pngs'])} PNG(s) and {len(res['videos'])} video(s) in "
         f"{time.perf_counter() - t:.1f}s; open {res['html']}", args.quiet)
    return 0


def cmd_layers(spec: str, layout: str | None) -> int:
    """Print the layers of an agent (module path, kind, output shape): the names `layer=` takes."""
    import jax
    import jax.numpy as jnp

    from jaxsal.backprop.layers import layer_calls, resolve_layer

    agent = load_agent(spec, None, layout)
    shape = tuple(agent.card.get("obs_shape") or ((4, 84, 84) if agent.layout == "NCHW" else (84, 84, 4)))
    _check_model(agent, (1,) + shape, layout)  # a channel-first model without --layout: says so, as explain does
    x = jnp.zeros((1,) + shape, jnp.float32)
    calls = layer_calls(agent.apply_fn, agent.params, x)
    try:
        default = resolve_layer(agent.apply_fn, agent.params, x, None)
    except Exception:  # noqa: BLE001 (no spatial layer: CAM methods do not apply)
        default = None
    print(f"{agent.name}: input {shape} ({agent.layout}); layers (name, kind, output shape per state):")
    for c in calls:  # a name several applies share (Dense_0 of Network, Actor, Critic) as layer= takes it
        name = c.qualified if sum(k.name == c.name for k in calls) > 1 else c.name
        mark = "   <- default layer of the CAM methods" if default in (c.name, c.qualified) else ""
        print(f"  {name:24s} {c.kind:14s} {tuple(c.shape[1:]) if c.shape else '-'}{mark}")
    del jax
    return 0


def _trained(card: dict) -> str:
    """' trained=F frames (S env steps xK)' in the card's (and README's) unit: frames."""
    frames, steps = card.get("frames_trained"), card.get("env_steps_trained")
    if frames is None:
        return f" trained={steps:,} env steps" if steps is not None else ""
    per = f" ({steps:,} env steps x{frames // steps})" if steps and frames != steps else ""
    return f" trained={frames:,} frames{per}"


def cmd_agents(args) -> int:
    from jaxsal.plugins import agent_provider

    if args.layers:
        return cmd_layers(args.layers, args.layout)

    provider = agent_provider()
    names = provider.available()
    if not names:
        print(f"the agents provider {provider.name!r} ships no agents yet; use --agent CARD.json --model PARAMS.msgpack")
        return 0
    for name in names:
        card = provider.card(name)
        ev = card.get("eval") or {}
        ret = (f" return={ev['mean_return']:.1f}+-{ev.get('std_return', 0):.1f} over {ev.get('episodes')} games"
               if "mean_return" in ev else "")
        steps = _trained(card)
        print(f"{name:24s} game={card.get('game')} arch={card.get('arch')} actions={card.get('num_actions')}"
              f"{steps}{ret}")
    return 0


def cmd_demo(args) -> int:
    from jaxsal.io import MethodSpec, run_job
    from jaxsal.plugins import agent_provider
    from jaxsal.io.store import MANIFEST, read_manifest
    from jaxsal.render import render_dir

    import jaxsal

    from jaxsal.agent_spec import as_agent

    t0 = time.perf_counter()
    if args.agent:
        agent = load_agent(args.agent, None, args.layout)
        _say(f"loaded agent {agent.name} ({agent.layout})", args.quiet)
    elif "breakout" in agent_provider().available():
        agent = as_agent(agent_provider().load("breakout"), default_name="breakout")
        _say(f"loaded the shipped Breakout agent ({agent.card.get('algorithm', agent.card.get('arch'))})",
             args.quiet)
    else:
        agent = as_agent(agent_provider().random_agent("breakout", args.seed),
                         default_name="breakout-random-init")
        _say("the shipped Breakout agent is not available yet (agents/shipped/breakout.json); using an "
             "UNTRAINED random-init agent, so the maps show the pipeline, not a trained policy", args.quiet)
    if args.methods:
        names = [m.strip() for m in args.methods.split(",") if m.strip()]
    else:
        names = [m for m in DEMO_METHODS if m in set(jaxsal.methods())]
    if not names:
        raise CLIError(f"none of the demo methods {DEMO_METHODS} is registered; available: "
                       f"{', '.join(jaxsal.methods()) or 'none'}")
    from jaxsal.io.job import check_specs
    from jaxsal.registry import accepted_options, get_method

    specs = [MethodSpec(m, m, {k: v for k, v in DEMO_OPTIONS.get(m, {}).items()
                               if k in accepted_options(get_method(m))}) for m in names]
    check_specs(specs)
    out = Path(args.out)
    if (out / MANIFEST).exists():
        if read_manifest(out).get("demo"):
            shutil.rmtree(out)  # a previous demo's output: start afresh
        else:
            raise CLIError(f"{out} holds a non-demo jaxsal job; choose another --out")
    elif out.exists() and any(out.iterdir()):
        raise CLIError(f"{out} exists and is not empty; choose another --out")
    from jaxsal.io.layout import as_layout

    source = as_layout(play(agent, args.steps, out, game=args.game, seed=args.seed, until_done=True,
                            quiet=args.quiet), agent.layout)
    summary = run_job(agent.apply_fn, agent.params, source, out, specs, chunk=args.chunk, layout=agent.layout,
                      batch_size=args.batch_size, seed=args.seed, agent={"name": agent.name, "card": agent.card},
                      input_id={"play": args.steps, "game": args.game or agent.card.get("game") or "breakout",
                                "seed": args.seed, "until_done": True},
                      quiet=args.quiet, extra_meta={"demo": True})
    res = render_dir(out, videos=("mp4", "gif") if not args.no_gif else ("mp4",), fps=args.fps)
    for line in _summary_lines(summary):
        _say(line, args.quiet)
    _say(f"demo done in {time.perf_counter() - t0:.1f}s. Look at: {res['html'].absolute()}\n"
         f"  video: {res['videos'][0].absolute()}\n  maps: jaxsal.load_maps('{out}', '{names[0]}')", args.quiet)
    return 0


# --------------------------------------------------------------------------- sweep
def _sweep_source(agent, cell, out: Path, target: str):
    """(the cell's frames in the model's layout, the whole input's length): a buffer (cut to its
    limit), or the agent's own rollout, played once per agent checkpoint x input and shared by its
    methods (a lock keeps parallel workers from playing it twice)."""
    import fcntl

    from jaxsal.io import open_source
    from jaxsal.io.layout import as_layout

    inp = cell.input_spec
    if "path" in inp:
        source = open_source(Path(inp["path"]))
    else:
        where = out / cell.input_dir
        where.mkdir(parents=True, exist_ok=True)
        saved = where / "_rollout" / "input" / "obs.npy"
        with open(where / ".play.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not saved.exists():
                play(agent, inp["play"], saved.parent.parent, game=inp.get("game"), seed=inp["seed"], quiet=True,
                     target=target)
        source = open_source(saved)
    source = as_layout(source, agent.layout)
    _check_model(agent, source.shape, None, target)
    _check_frames(agent, source.shape)
    n = len(source)
    return (_Limited(source, inp["limit"]) if "limit" in inp else source), n


_SWEEP_MODELS = LRU("sweep architectures", 64)  # agent card (JSON) -> the apply_fn of its architecture
_SWEEP_LAST = LRU("sweep last agent", 1)  # (spec, checkpoint, their files' times) -> the last cell's agent


def _sweep_agent(cell):
    """The cell's agent, loaded once for the consecutive cells of one checkpoint. Checkpoints of one
    card (a shipped name, a card, a .msgpack with its card) share one apply_fn, so the compiled
    programs of one cell serve the next instead of compiling again."""
    import dataclasses

    from jaxsal.agent_spec import is_function_spec
    from jaxsal.loaders import FILE_SUFFIXES

    stamp = [(p, os.stat(p).st_mtime_ns) for p in (cell.spec.rpartition(":")[0] if is_function_spec(cell.spec)
                                                    else cell.spec, cell.model) if p and os.path.exists(p)]
    key = (cell.spec, cell.model, tuple(stamp))  # consecutive cells of one checkpoint load it once
    agent = _SWEEP_LAST.get_or_build(key, lambda: load_agent(cell.spec, cell.model, None))
    if is_function_spec(cell.spec) or Path(cell.spec).suffix in FILE_SUFFIXES or not agent.card:
        return agent
    key = json.dumps([agent.card, agent.layout, agent.pixels], sort_keys=True, default=str)
    return dataclasses.replace(agent, apply_fn=_SWEEP_MODELS.get_or_build(key, lambda: agent.apply_fn))


def run_sweep_cell(cell, out: Path, metrics, sett: dict) -> dict:
    """Run one cell of a sweep: its explain job (run_job: resumable, chunked) in DIR/<cell>/job,
    then its statistics and metrics; the record (status ok or error with its one-line message,
    frames, seconds) goes to DIR/<cell>/cell.json. Errors are recorded, never raised."""
    from jaxsal.io import MethodSpec, run_job
    from jaxsal.io import sweep as sw

    t0 = time.perf_counter()
    where = Path(out) / cell.path
    rec = {"cell": cell.path, "status": "ok", "error": "", "frames": None, "metrics": {}}
    try:
        agent = _sweep_agent(cell)
        source, n_input = _sweep_source(agent, cell, Path(out), sett["target"])
        rec["frames"] = len(source)
        objects = None
        if "objects" in metrics:
            from jaxsal.io.layout import to_nhwc_shape
            from jaxsal.io.objects import for_job

            objects, _ = for_job("auto", "maps", cell.input_spec.get("path"), agent.card.get("game"), n_input,
                                 to_nhwc_shape(source.shape, agent.layout), cell.input_spec.get("limit"))
        inp = cell.input_spec
        input_id = {k: inp[k] for k in ("play", "seed", "game") if k in inp} if "play" in inp else None
        spec = MethodSpec(cell.method, cell.method_name, cell.options)
        run_job(agent.apply_fn, agent.params, source, where / sw.JOB, [spec], target=sett["target"],
                chunk=sett["chunk"], batch_size=sett["batch_size"], seed=sett["seed"],
                agent={"name": agent.name, "card": agent.card}, input_id=input_id, quiet=True, layout=agent.layout,
                extra_meta={"sweep_cell": cell.path}, objects=objects)
        module = getattr(getattr(agent.apply_fn, "fn", None), "__self__", None)
        init = module if hasattr(module, "init") and hasattr(module, "apply") else None
        rec["metrics"] = sw.cell_metrics(agent.apply_fn, agent.params, source, where / sw.JOB, cell, metrics, sett,
                                         layout=agent.layout, init_fn=init)
    except Exception as e:  # noqa: BLE001 (recorded in the table; the other cells go on)
        if os.environ.get("JAXSAL_DEBUG"):
            raise
        rec.update(status="error", error=_message(e), metrics={})
    rec["seconds"] = round(time.perf_counter() - t0, 3)
    sw.write_record(where / sw.CELL_RECORD, rec)
    return rec


def sweep_worker():
    """A worker process of `jaxsal sweep --workers N`: reads one cell (JSON) on stdin, runs it."""
    from jaxsal import cpu

    cpu.use_fast_kernels(warn=False)
    from jaxsal.io import sweep as sw

    job = json.loads(sys.stdin.read())
    run_sweep_cell(sw.Cell(**job["cell"]), Path(job["out"]), job["metrics"], job["settings"])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown (XLA threads); the record is on disk


def _run_workers(todo, out: Path, metrics, sett, workers: int, finished):
    """Run the cells in up to `workers` processes at once (`sweep_worker`, the cell as JSON on
    stdin); a worker that dies without a record gets an error record; `finished(cell)` after each."""
    import subprocess
    import tempfile

    from jaxsal.io import sweep as sw

    pending, running = list(todo), {}
    try:
        while pending or running:
            while pending and len(running) < workers:
                cell = pending.pop(0)
                (out / cell.path).mkdir(parents=True, exist_ok=True)
                (out / cell.path / sw.CELL_RECORD).unlink(missing_ok=True)  # an old error: retried now
                err = tempfile.TemporaryFile()
                proc = subprocess.Popen([sys.executable, "-c", "from jaxsal.cli import sweep_worker; sweep_worker()"],
                                        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err)
                try:
                    proc.stdin.write(json.dumps({"cell": cell.as_dict(), "out": str(out.absolute()),
                                                 "metrics": metrics, "settings": sett}).encode())
                    proc.stdin.close()
                except BrokenPipeError:  # the worker died at once: recorded below from its exit code
                    pass
                running[proc] = (cell, err)
            time.sleep(0.05)
            for proc in [p for p in running if p.poll() is not None]:
                cell, err = running.pop(proc)
                if sw.read_record(out, cell) is None:
                    err.seek(0)
                    lines = [ln for ln in err.read().decode(errors="replace").splitlines() if ln.strip()]
                    why = f"worker exited with code {proc.returncode}" + (f": {lines[-1][:300]}" if lines else "")
                    sw.write_record(out / cell.path / sw.CELL_RECORD, {
                        "cell": cell.path, "status": "error", "frames": None, "metrics": {}, "seconds": None,
                        "error": why})
                err.close()
                finished(cell)
    except BaseException:
        for proc in running:
            proc.terminate()  # SIGTERM: a job keeps its finished chunks, a rerun resumes
        for proc in running:
            proc.wait()
        raise


RAY_HINT = "pip install 'jaxsal[ray]'"


def _import_ray():
    try:
        import ray
    except ImportError:
        raise CLIError(f"--ray needs Ray, which is not installed: {RAY_HINT}") from None
    return ray


def ray_cell(job_json: str) -> str:
    """A Ray task of `jaxsal sweep --ray`: one cell, given and returned as JSON (the cell spec, DIR,
    metrics and settings in; its record out); the cell's files go to the shared DIR."""
    from jaxsal import cpu

    cpu.use_fast_kernels(warn=False)
    from jaxsal.io import sweep as sw

    job = json.loads(job_json)
    rec = run_sweep_cell(sw.Cell(**job["cell"]), Path(job["out"]), job["metrics"], job["settings"])
    return json.dumps(rec, allow_nan=True)


def ray_task_env(gpus: float) -> dict | None:
    """The Ray runtime environment of a cell's task. Ray hides no GPU from a task that asked for none,
    whose JAX would take the node's GPUs (and their memory) anyway: such a task runs JAX on the CPU.
    A task given a fraction of a GPU preallocates that fraction of its memory (XLA's default, 75% of
    the whole GPU, would not leave room for the others sharing it)."""
    if gpus == 0:
        return {"env_vars": {"JAX_PLATFORMS": "cpu"}}
    if gpus < 1:
        return {"env_vars": {"XLA_PYTHON_CLIENT_MEM_FRACTION": f"{0.9 * gpus:.3f}"}}
    return None


def _ray_address(address: str) -> tuple[bool, int | None]:
    """(local, CPUS) of --ray: local, local:CPUS (a Ray instance started here) or a cluster's address."""
    kind, colon, n = address.partition(":")
    if kind != "local":
        return False, None
    if colon and not (n.isdigit() and int(n) > 0):
        raise CLIError(f"--ray {address!r}: use local, local:CPUS (a positive integer) or a cluster ADDRESS")
    return True, int(n) if n else None


def _run_ray(todo, out: Path, metrics, sett, address: str, cpus: float, gpus: float, finished):
    """Run the cells as Ray tasks (`ray_cell`, `cpus` CPUs and `gpus` GPUs each) on the cluster at
    `address`, or on a Ray instance started here (`local`, `local:CPUS`), or on the one this process
    has already started (ray.init); `finished(cell)` after each. A task that dies is recorded as an
    error; a record missing from DIR after its task (a DIR the node does not share) too."""
    from jaxsal.io import sweep as sw

    if not todo:
        return
    ray = _import_ray()
    started = False
    if not ray.is_initialized():
        import warnings

        local, num = _ray_address(address)
        with warnings.catch_warnings():  # Ray starts its processes with fork+exec, which is safe here
            warnings.filterwarnings("ignore", message="os.fork", category=RuntimeWarning)
            if local:
                ray.init(num_cpus=num, include_dashboard=False, log_to_driver=False)
            else:
                try:
                    ray.init(address=address, log_to_driver=False)
                except ConnectionError as e:
                    raise CLIError(f"--ray {address}: cannot connect to a Ray cluster there "
                                   f"({str(e).splitlines()[0]}); give its address (ray start --head prints it), "
                                   "or --ray local") from None
        started = True
    task = ray.remote(num_cpus=cpus, num_gpus=gpus, max_retries=0, runtime_env=ray_task_env(gpus))(ray_cell)
    refs = {}
    try:
        for cell in todo:
            (out / cell.path).mkdir(parents=True, exist_ok=True)
            (out / cell.path / sw.CELL_RECORD).unlink(missing_ok=True)  # an old error: retried now
            job = json.dumps({"cell": cell.as_dict(), "out": str(out.absolute()), "metrics": metrics,
                              "settings": sett})
            refs[task.remote(job)] = cell
        while refs:
            ready, _ = ray.wait(list(refs), num_returns=1)
            for ref in ready:
                cell = refs.pop(ref)
                try:
                    ray.get(ref)
                    why = None if sw.read_record(out, cell) is not None else (
                        f"its Ray task finished but left no record in {out.absolute()}: --out must be a folder "
                        "every Ray node shares")
                except Exception as e:  # noqa: BLE001 (the task or its worker died)
                    lines = [ln for ln in str(e).splitlines() if ln.strip()]
                    why = f"Ray task failed: {type(e).__name__}" + (f": {lines[-1][:300]}" if lines else "")
                if why is not None:
                    sw.write_record(out / cell.path / sw.CELL_RECORD, {
                        "cell": cell.path, "status": "error", "frames": None, "metrics": {}, "seconds": None,
                        "error": why})
                finished(cell)
    except BaseException:
        for ref in refs:
            ray.cancel(ref)  # a job keeps its finished chunks, a rerun resumes
        raise
    finally:
        if started:
            ray.shutdown()


def _verify_sweep_inputs(cells):
    """Every buffer the sweep reads, opened and verified once (each member's checksum) before any cell runs."""
    from jaxsal.io import open_source
    from jaxsal.io.readers import verify_input

    for path in dict.fromkeys(c.input_spec["path"] for c in cells if "path" in c.input_spec):
        verify_input(open_source(Path(path)))


def cmd_sweep(args) -> int:
    from jaxsal.io import sweep as sw

    if args.workers < 1:
        raise CLIError(f"--workers must be a positive integer, got {args.workers}")
    if args.ray is None and (args.cpus_per_cell is not None or args.gpus_per_cell is not None):
        raise CLIError("--cpus-per-cell and --gpus-per-cell are for --ray; add --ray local or --ray ADDRESS")
    cpus = 1.0 if args.cpus_per_cell is None else args.cpus_per_cell
    gpus = 0.0 if args.gpus_per_cell is None else args.gpus_per_cell
    if args.ray is not None:
        if args.workers != 1:
            raise CLIError("--workers is for local processes; with --ray the cluster's CPUs and --cpus-per-cell "
                           "decide how many cells run at once")
        if not cpus > 0 or gpus < 0:
            raise CLIError(f"--cpus-per-cell must be positive and --gpus-per-cell not negative, got {cpus:g} and "
                           f"{gpus:g}")
        _ray_address(args.ray)
        _import_ray()  # before anything is written
    path = Path(args.config)
    raw = sw.read_config(path)
    base = path.absolute().parent
    cells, metrics, sett = sw.plan(raw, base)  # every check before anything is written
    _verify_sweep_inputs(cells)
    out = Path(args.out)
    stored = sw.stored_config(raw, base)
    sw.check_dir(out, stored, path.name)
    out.mkdir(parents=True, exist_ok=True)
    if not (out / sw.CONFIG_JSON).exists():
        from jaxsal.io.store import atomic_write

        atomic_write(out / sw.CONFIG_TOML, path.read_bytes())
        atomic_write(out / sw.CONFIG_JSON, json.dumps(stored, indent=2, sort_keys=True).encode())
    done = [c for c in cells if (sw.read_record(out, c) or {}).get("status") == "ok"]
    todo = [c for c in cells if c not in done]
    how = f"Ray tasks ({args.ray}, {cpus:g} CPU(s)" + (f", {gpus:g} GPU(s)" if gpus else "") + " each)" \
        if args.ray is not None else f"{args.workers} worker(s)"
    _say(f"sweep: {len(cells)} cells ({len(done)} done already), {len(todo)} to run with {how} into {out}",
         args.quiet)
    sw.write_table(out, cells, metrics, sett, base)

    def finished(cell):
        rec = sw.read_record(out, cell) or {}
        _say(f"  {cell.path}: {rec.get('status')}" + (f" ({rec.get('error')})" if rec.get("error") else
                                                       f" in {rec.get('seconds')}s"), args.quiet)
        sw.write_table(out, cells, metrics, sett, base)

    if args.ray is not None:
        _run_ray(todo, out, metrics, sett, args.ray, cpus, gpus, finished)
    elif args.workers == 1:
        for cell in todo:
            run_sweep_cell(cell, out, metrics, sett)
            finished(cell)
    else:
        _run_workers(todo, out, metrics, sett, args.workers, finished)
    table = sw.write_table(out, cells, metrics, sett, base)
    failed = [c for c in cells if (sw.read_record(out, c) or {}).get("status") != "ok"]
    for c in failed:
        print(f"jaxsal: error: cell {c.path} failed: {(sw.read_record(out, c) or {}).get('error')}", file=sys.stderr)
    _say(f"sweep done: {len(cells) - len(failed)} of {len(cells)} cells ok; table {table} "
         f"(jaxsal.load_sweep('{out}'))" + ("; rerun the same command to retry the failed cells" if failed else ""),
         args.quiet)
    return EXIT_INTERNAL if failed else 0


# --------------------------------------------------------------------------- entry point
def _explain_epilog() -> str:
    from jaxsal.registry import METHODS
    from jaxsal.targets import TARGET_NAMES

    import jaxsal  # noqa: F401  (registers the methods)

    return ("methods: " + ", ".join(sorted(m for m in METHODS if not m.startswith("standin"))) + "\n"
            "  options: --option METHOD.NAME=VALUE; each method's options and defaults:\n"
            "  python -c 'import jaxsal; print(jaxsal.method_options(\"rise\"))'\n"
            "targets: " + ", ".join(TARGET_NAMES) + " (q_action: the buffer's actions, an .npz's\n"
            "  'actions' array of one integer per frame stack, or a Dopamine buffer's action files)\n"
            "layers: CAM methods tap the last conv layer by default; list an agent's layers with\n"
            "  jaxsal agents --layers SPEC   (e.g. jaxsal agents --layers breakout), pick one with\n"
            "  --option gradcam.layer=conv1\n"
            "outputs: DIR/METHOD/chunk_*.npy maps (jaxsal.load_maps), DIR/_outputs per-frame action,\n"
            "  Q-values/logits and index in the input (jaxsal.load_outputs: row number, or Dopamine buffer\n"
            "  index and checkpoint), DIR/manifest.json (resolved options), with --objects\n"
            "  DIR/_objects/METHOD/chunk_*.npz per-frame object shares (jaxsal.load_object_shares), with\n"
            "  --effects DIR/_objects/_effects/chunk_*.npz per-frame object effects (jaxsal.load_object_effects)\n"
            "examples:\n"
            "  jaxsal explain --agent my_agent.py:load --methods gradcam,gradient --input buffer.npz --out maps/\n"
            "  jaxsal explain --agent runs/x/dqn_atari_jax.cleanrl_model --methods gradcam --input replay/ "
            "--out maps/\n"
            "  python -m jaxsal_agents.record_objects --agent pong --steps 500 --out buf/\n"
            "  jaxsal explain --agent pong --methods gradient,gradcam --input buf/obs.npy --objects --store shares "
            "--out shares/")


SWEEP_EPILOG = """config (TOML; docs/guides/sweeps.md):
  agents = ["breakout", "runs/pong/*.msgpack"]   # any --agent SPEC; a glob: its checkpoints, sorted
  inputs = ["buffer.npy", { play = 500, seed = 1 }]
  metrics = ["insertion", "objects"]             # also deletion, sanity; map statistics always
  [methods]
  gradcam = { layer = "conv3" }
  occlusion = { patch = 6 }
outputs: DIR/cells/AGENT/CHECKPOINT/INPUT/METHOD/job (a `jaxsal explain` output: jaxsal.load_maps),
  DIR/results.csv (one row per cell: jaxsal.load_sweep(DIR)), DIR/sweep.toml (the config)
pictures: jaxsal render DIR (curves.png: each metric against checkpoint; grid.png: a frame per cell)
ray: --ray local:4 or --ray ADDRESS (pip install 'jaxsal[ray]'; --out shared by every node)"""


def build_parser() -> argparse.ArgumentParser:
    from jaxsal import __version__
    p = argparse.ArgumentParser(prog="jaxsal", description="Saliency maps for deep RL agents, in batch.")
    p.add_argument("--version", action="version", version=f"jaxsal {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    e = sub.add_parser("explain", help="explain every frame of a replay buffer or a fresh rollout",
                       description="Explain every frame of a replay buffer (or a fresh rollout) with one or more "
                                   "saliency methods; resumable, chunked, one directory per method.",
                       epilog=_explain_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    e.add_argument("--agent", required=True, help=AGENT_HELP)
    e.add_argument("--layout", choices=["NHWC", "NCHW"],
                   help="the model's input layout, overriding the agent's (buffers in either layout are "
                        "recognised from their shape)")
    e.add_argument("--model", help="parameter file (.msgpack) to use with the agent's card")
    e.add_argument("--methods", required=True, help="comma list, e.g. gradcam,rise or alias=method")
    e.add_argument("--input", help=".npy/.npz (key obs) file, shard directory or Dopamine replay directory (its "
                                    "add_count and invalid_range files are required: the states are Dopamine's "
                                    "valid transitions, oldest first; jaxsal.load_outputs gives each one's buffer "
                                    "index)")
    e.add_argument("--play", type=int, help="play STEPS steps with EnvPool and explain them")
    e.add_argument("--game", help="game for --play (default: the agent's game)")
    e.add_argument("--out", required=True, help="output directory (resumes a stopped job)")
    e.add_argument("--option", action="append", metavar="METHOD.NAME=VALUE",
                   help="method option, e.g. rise.n_masks=500 or gradcam.layer=conv3 (repeatable)")
    e.add_argument("--target", default="q_chosen",
                   help="what is explained (default q_chosen): q_chosen, q_action (the buffer's actions), "
                        "advantage, value, policy_logit, log_prob, softmax_chosen")
    e.add_argument("--batch-size", type=int, default=256, help="model rows per device call (memory knob)")
    e.add_argument("--chunk", type=int, default=512, help="frames per output chunk / read from disk")
    e.add_argument("--dtype", default="float32", choices=["float32", "float16"], help="stored map dtype")
    e.add_argument("--seed", type=int, default=0, help="PRNG seed of stochastic methods and --play")
    e.add_argument("--limit", type=int, help="only the first N frames of the input")
    e.add_argument("--objects", nargs="?", const="auto", metavar="FILE",
                   help="also store per-frame object shares (per class: positive and absolute mass, chance, "
                        "per stacked frame; jaxsal.load_object_shares) from the boxes in FILE (.npz: boxes, "
                        "labels, classes; see jaxsal.io.objects), or without FILE from INPUT.objects.npz beside "
                        "the input (python -m jaxsal_agents.record_objects writes both)")
    e.add_argument("--effects", action="store_true",
                   help="with --objects: also remove each object class from every stacked frame of each state "
                        "(its pixels outside other classes' boxes set to the median of a ring around each box) and "
                        "store how much the explained output drops, whether the greedy action flips, and what the "
                        "removal did: overlap with other boxes (kept) and residue pixels left around its boxes "
                        "(jaxsal.load_object_effects; jaxsal render draws them)")
    e.add_argument("--store", choices=["maps", "shares"], default="maps",
                   help="maps (default; with --objects also the shares) or shares: only the object shares, "
                        "a few numbers per frame instead of the maps")
    e.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    e.add_argument("--coordinator", help="HOST:PORT of process 0 for a multi-process job")
    e.add_argument("--num-processes", type=int, default=1)
    e.add_argument("--process-id", type=int)
    e.set_defaults(fn=cmd_explain)

    r = sub.add_parser("render", help="PNG grids, videos and an HTML gallery of an explain output")
    r.add_argument("dir", help="output directory of `jaxsal explain`, or of `jaxsal sweep` (then: curves.png, "
                               "each metric against checkpoint, and grid.png, frame START of --frames in every "
                               "cell)")
    r.add_argument("--methods", help="comma list of methods to show (default all)")
    r.add_argument("--out", help="gallery directory (default DIR/gallery)")
    r.add_argument("--frames", help="START:STOP range of frames (videos are capped at 1000 frames)")
    r.add_argument("--input", help="frames to draw on, if the job's input moved")
    r.add_argument("--video", default="mp4,gif", help="mp4, gif, mp4,gif or none")
    r.add_argument("--scheme", default="auto", choices=["auto", "signed", "heat", "abs"],
                   help="colour scale: signed (green +, red -), heat (non-negative; on signed maps it drops the "
                        "negative values and says how much), abs (|m| Gaussian-smoothed, as Greydanus / Paper A "
                        "show gradients), auto (signed if the maps have negative values, else heat)")
    r.add_argument("--greydanus", help="ACTOR,CRITIC: Greydanus colouring (actor blue, critic red) in videos")
    r.add_argument("--grid-frames", type=int, default=6)
    r.add_argument("--fps", type=int, default=15)
    r.add_argument("--scale", type=int, default=3, help="pixel upscaling of the pictures")
    r.add_argument("--objects", metavar="FILE", help="the objects file of a job run with --objects, if it moved "
                                                     "(or boxes to draw on a job without them)")
    r.add_argument("--no-boxes", action="store_true", help="do not draw the object boxes of a job run with --objects")
    r.add_argument("--quiet", action="store_true")
    r.set_defaults(fn=cmd_render)

    d = sub.add_parser("demo", help="play Breakout, explain every frame, write a gallery and a video")
    d.add_argument("--agent", help="any agent SPEC as for `jaxsal explain --agent` (default: the shipped "
                                   "Breakout agent)")
    d.add_argument("--layout", choices=["NHWC", "NCHW"], help="the model's input layout, overriding the agent's")
    d.add_argument("--game", help="game to play (default: the agent's, else breakout)")
    d.add_argument("--steps", type=int, default=400, help="episode length cap (default 400)")
    d.add_argument("--out", default="jaxsal-out/demo", help="output directory (default jaxsal-out/demo)")
    d.add_argument("--methods", help=f"comma list (default: {','.join(DEMO_METHODS)} where available)")
    d.add_argument("--batch-size", type=int, default=256)
    d.add_argument("--chunk", type=int, default=128)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--fps", type=int, default=15)
    d.add_argument("--no-gif", action="store_true", help="write only the MP4")
    d.add_argument("--quiet", action="store_true")
    d.set_defaults(fn=cmd_demo)

    w = sub.add_parser("sweep", help="explain every agent x checkpoint x input x method of a TOML config into "
                                     "one table",
                       description="Run one resumable explain job per agent x checkpoint x input x method of a TOML "
                                   "config, with map statistics and the config's metrics, into DIR/results.csv "
                                   "(jaxsal.load_sweep). A rerun computes only what is missing.",
                       epilog=SWEEP_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    w.add_argument("config", help="the sweep's .toml file (paths in it are relative to its folder)")
    w.add_argument("--out", required=True, help="output directory (a rerun with the same config resumes)")
    w.add_argument("--workers", type=int, default=1, help="cells run at once, each in a process of its own "
                                                          "(default 1: one after another, in this process)")
    w.add_argument("--ray", metavar="ADDRESS", help="run the cells as tasks on the Ray cluster at ADDRESS (e.g. "
                                                    "ray://head:10001 or auto), or on a Ray instance started here: "
                                                    "local (every CPU) or local:CPUS; --out must be a folder every "
                                                    f"node shares (needs {RAY_HINT})")
    w.add_argument("--cpus-per-cell", type=float, help="CPUs each Ray task asks for (default 1; with --ray)")
    w.add_argument("--gpus-per-cell", type=float, help="GPUs each Ray task asks for (default 0; with --ray)")
    w.add_argument("--quiet", action="store_true", help="no progress lines")
    w.set_defaults(fn=cmd_sweep)

    a = sub.add_parser("agents", help="list the shipped agents, or an agent's layers (--layers SPEC)")
    a.add_argument("--layers", metavar="SPEC", help="print the layer names (for layer= / --option M.layer=) "
                                                    "of any agent SPEC, and the CAM methods' default")
    a.add_argument("--layout", choices=["NHWC", "NCHW"], help="the model's input layout, overriding the agent's")
    a.set_defaults(fn=cmd_agents)
    return p


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread: a job stops as on Ctrl-C (finished chunks kept, resumable)."""


def _on_sigterm(signum, frame):
    raise Terminated()


def main(argv=None) -> int:
    """Console entry point; returns the exit status (also used by `sys.exit`)."""
    import signal
    import threading

    args = build_parser().parse_args(argv)
    from jaxsal import cpu
    cpu.use_fast_kernels(warn=False)  # before any JAX computation: XLA reads its flags once
    handled = threading.current_thread() is threading.main_thread()  # signals reach the main thread only
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if handled else None
    try:
        code = args.fn(args)
    except KeyboardInterrupt as e:
        term = isinstance(e, Terminated)
        saved = getattr(e, "jaxsal_saved", "finished chunks are kept")
        code = _die(f"{'terminated (SIGTERM)' if term else 'interrupted'}; {saved}, no partial chunk is counted; "
                    "rerun the same command to resume", EXIT_TERM if term else EXIT_INTERRUPT)
        if argv is None:  # console: skip interpreter teardown, which can crash (SIGSEGV) while XLA
            sys.stdout.flush()  # or reader threads are still busy; every finished chunk is on disk
            sys.stderr.flush()
            os._exit(code)
    except Exception as e:  # one line for the user, never a traceback
        if os.environ.get("JAXSAL_DEBUG"):
            raise
        job = args.fn in (cmd_explain, cmd_sweep, cmd_demo)
        code = _die(_message(e, job), EXIT_INPUT if _is_user_error(e) else EXIT_INTERNAL)
    finally:
        if handled:  # in-process callers (tests, notebooks) get their handler back
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
    if argv is None:
        sys.exit(code)
    return code


def _is_user_error(e: Exception) -> bool:
    from jaxsal.errors import SaliencyInputError

    return isinstance(e, (CLIError, SaliencyInputError, OSError))  # provider errors: jaxsal.plugins


def _message(e: Exception, job: bool = True) -> str:
    """The one line for an error; `job`: the command is a resumable job (explain, sweep, demo), whose
    finished chunks a rerun resumes (else, e.g. render, that advice is left out)."""
    import errno

    if isinstance(e, OSError):
        what = e.strerror or str(e)
        where = f" ({e.filename})" if e.filename else ""
        hint = {errno.ENOSPC: "free some space there or choose another --out",
                errno.EACCES: "choose a writable --out", errno.EROFS: "choose a writable --out"}.get(
            e.errno, "check the path")
        resume = "; finished chunks are kept, rerun the same command to resume" if job else ""
        return f"{what}{where}: {hint}{resume}"
    if _is_user_error(e):
        return str(e).splitlines()[0] if str(e) else type(e).__name__
    return f"internal error {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} " \
           "(set JAXSAL_DEBUG=1 for the traceback)"


if __name__ == "__main__":
    main()
