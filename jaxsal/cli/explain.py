"""`jaxsal explain`: every frame of a replay buffer or a fresh rollout, with one or more methods, into a
resumable, chunked output directory."""
from __future__ import annotations

import argparse
import ast
from pathlib import Path

from jaxsal.cli._agent import AGENT_HELP, check_agent, check_buffer_actions, check_frames, check_layers, load_agent
from jaxsal.cli._common import check_flag, check_positive, say, summary_lines
from jaxsal.cli._input import Limited, play
from jaxsal.engine.precision import PRECISIONS
from jaxsal.errors import CLIError


def parse_methods(text: str) -> list[tuple[str, str]]:
    """'gradcam,critic=occlusion,sg=noise_tunnel(gradcam, n=16)' -> [(alias, method), ...]: split at
    top-level commas; a method is an expression (jaxsal.engine.expression), in its canonical text; an
    expression without alias= gets expression.alias."""
    from jaxsal.engine import expression

    out = []
    for item in expression.split(text):
        item = item.strip()
        if not item:
            continue
        alias, eq, method = item.partition("=")
        if not eq or "(" in alias:  # no alias: the '=' (if any) is a keyword's, inside the call
            alias, method = "", item
        method = expression.canonical(method)
        out.append((alias.strip() or expression.alias(method), method))
    if not out:
        raise CLIError("--methods is empty; e.g. --methods gradcam,gradient")
    return out


def parse_value(text: str):
    """A Python literal ('500', '[1, 2]', 'True'), else the text itself; thousands of '~' or '-' overflow
    Python's parser (RecursionError, MemoryError): a CLIError, which parse_options names the option in."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return {"true": True, "false": False, "none": None}.get(text.lower(), text)
    except (RecursionError, MemoryError):
        raise CLIError(f"its value ({len(text)} characters) is nested too deeply to read; give a number, a "
                       "string, True/False or a list, e.g. rise.n_masks=500") from None


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
        try:
            opts[method][key] = parse_value(value)
        except CLIError as e:
            raise CLIError(f"--option {name}: {e}") from None
    return opts


def _check_numbers(args):
    """The numeric options, before the agent is loaded."""
    for flag, value in (("--batch-size", args.batch_size), ("--chunk", args.chunk), ("--limit", args.limit),
                        ("--num-processes", args.num_processes)):
        if value is not None:
            check_positive(flag, value, {"--batch-size": " (model rows per device call, e.g. --batch-size 256)",
                                         "--chunk": " (frames per output chunk, e.g. --chunk 512)",
                                         "--limit": " (explain only the first N frames)"}.get(flag, ""))
    from jaxsal.checks import check_seed

    check_flag(check_seed, "--seed", args.seed)  # also --play's: the game is seeded before the job starts


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


def cmd_explain(args) -> int:
    from jaxsal.io import MethodSpec
    from jaxsal.io.job import check_specs

    pairs = parse_methods(args.methods)
    opts = parse_options(args.option, [a for a, _ in pairs])
    specs = [MethodSpec(a, m, opts[a]) for a, m in pairs]
    check_specs(specs)
    if (args.input is None) == (args.play is None):
        raise CLIError("give exactly one of --input PATH or --play STEPS")
    if args.objects not in (None, "auto") and args.play is not None:
        raise CLIError(f"--play records the boxes of its own frames: give --objects without FILE "
                       f"(not {args.objects})")
    if args.store == "shares" and args.objects is None:
        raise CLIError("--store shares keeps only the object shares: add --objects [FILE]")
    if args.effects and args.objects is None:
        from jaxsal.io.object_files import EFFECTS_NEED_OBJECTS
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
    for line in summary_lines(summary):
        say(line, args.quiet)
    if args.objects is not None and summary["complete"]:
        from jaxsal.io.object_files import summary_lines as object_lines

        for line in object_lines(out, [a for a, _ in pairs], effects=args.effects):
            say(line, args.quiet)
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
                      layout_given=args.layout, objects=args.objects is not None)
        input_id = {"play": args.play, "game": args.game or agent.card.get("game"), "seed": args.seed}
    else:
        source = open_source(Path(args.input).absolute())  # the manifest records where it is, from anywhere
        verify_input(source)  # every member's checksum, before any frame is looked at
        input_id = None
    source = as_layout(source, agent.layout)  # (N, 84, 84, 4) or (N, 4, 84, 84): the model's layout
    model_out = check_agent(agent, source.shape, args.layout, args.target)
    check_frames(agent, source.shape)
    check_buffer_actions(agent, source, agent.num_actions or num_actions(model_out))
    objects, store_maps = _objects_for(args, agent, source)
    if args.limit is not None:
        source = Limited(source, args.limit)
    check_layers(agent, specs, source)
    say(f"explaining {len(source)} frames of {source.describe().get('path') or 'the rollout'} with "
        f"{', '.join(s.alias for s in specs)} (agent {agent.name}, {jaxsal.__version__})", args.quiet)
    try:
        return run_job(agent.apply_fn, agent.params, source, out, specs, target=args.target, chunk=args.chunk,
                       batch_size=args.batch_size, dtype=args.dtype, seed=args.seed, precision=args.precision,
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
    from jaxsal.io import store

    if not out.is_dir():
        return
    try:
        with store.job_lock(out):  # another job writing here now: what is new may be its files
            new = [p for p in out.rglob("*") if before is None or p not in before]
            if any(p.name.startswith("chunk_") and p.is_file() for p in new):
                return
            for p in sorted(new, key=lambda q: len(q.parts), reverse=True):
                if p.is_dir() and not p.is_symlink():
                    p.rmdir()  # only empty directories: everything in them is new too
                else:
                    p.unlink()
            if before is None:
                out.rmdir()
    except (OSError, store.JobBusyError):
        pass  # best effort: the error being reported matters more


def _saved(out: Path, specs) -> str:
    """'K of M chunks are saved in OUT' for a stopped job."""
    from jaxsal.io import store

    try:
        cfg = store.read_manifest(out)["config"]
        n_chunks = -(-int(cfg["n"]) // int(cfg["chunk"]))
        maps = cfg.get("store") != "shares"
        from jaxsal.io.object_files import effects_path

        effects = "effects" in cfg.get("objects", {})
        done = sum(store.outputs_path(out, i).exists()
                   and (not maps or all(store.chunk_path(out, s.alias, i).exists() for s in specs))
                   and (not effects or effects_path(out, i).exists())
                   for i in range(n_chunks))
    except Exception:  # noqa: BLE001 (the message is a courtesy)
        return f"finished chunks are kept in {out}"
    return f"{done} of {n_chunks} chunks are saved in {out}"


def _objects_for(args, agent, source):
    """--objects [FILE] / --store: the boxes of the input's frames (jaxsal.io.object_files) and whether
    the maps are stored too."""
    from jaxsal.io.layout import to_nhwc_shape
    from jaxsal.io.object_files import for_job

    objects = args.objects if args.objects in (None, "auto") else str(Path(args.objects).absolute())
    # a --play rollout lies in OUT/input/obs.npy, its boxes (with --objects) beside it
    where = str(Path(args.input).absolute()) if args.input is not None else source.describe().get("path")
    return for_job(objects, args.store, where, agent.card.get("game"), len(source),
                   to_nhwc_shape(source.shape, agent.layout), args.limit, effects=args.effects)


def _explain_epilog() -> str:
    import contextlib

    from jaxsal.engine import expression
    from jaxsal.plugins import load_methods
    from jaxsal.registry import METHODS
    from jaxsal.targets import TARGET_NAMES

    import jaxsal  # noqa: F401  (registers the methods)

    with contextlib.suppress(Exception):  # a broken plugin is reported by main(), in one line
        load_methods()  # the plugins' methods are listed too
    return ("methods: " + ", ".join(sorted(METHODS)) + "\n"
            "  combined: " + expression.forms() + " of a gradient or CAM method,\n"
            "  e.g. --methods \"gradcam,sg=" + expression.EXAMPLE + "\" (an alias= names its directory)\n"
            "  options: --option METHOD.NAME=VALUE (or ALIAS.NAME=VALUE); each method's options and defaults:\n"
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


def add_parser(sub):
    """The `jaxsal explain` command and its flags."""
    e = sub.add_parser("explain", help="explain every frame of a replay buffer or a fresh rollout",
                       description="Explain every frame of a replay buffer (or a fresh rollout) with one or more "
                                   "saliency methods; resumable, chunked, one directory per method.",
                       epilog=_explain_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    e.add_argument("--agent", required=True, help=AGENT_HELP)
    e.add_argument("--layout", choices=["NHWC", "NCHW"],
                   help="the model's input layout, overriding the agent's (buffers in either layout are "
                        "recognised from their shape)")
    e.add_argument("--model", help="parameter file (.msgpack) to use with the agent's card")
    e.add_argument("--methods", required=True, help="comma list, e.g. gradcam,rise or alias=method; a combined method is one "
                                                  "item: sg=noise_tunnel(gradcam, n=16)")
    e.add_argument("--input", help=".npy/.npz (key obs) file, shard directory or Dopamine replay directory (its "
                                    "add_count and invalid_range files are required: the states are Dopamine's "
                                    "valid transitions, oldest first; jaxsal.load_outputs gives each one's buffer "
                                    "index)")
    e.add_argument("--play", type=int, help="play STEPS steps with EnvPool (with --objects: on ale-py, the same "
                                            "frames, recording each state's object boxes) and explain them")
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
    e.add_argument("--precision", default="float32", choices=PRECISIONS,
                   help="precision of the model's convolutions and matmuls, backward passes included (default "
                        "float32); bfloat16: bfloat16 operands, float32 accumulation, float32 maps")
    e.add_argument("--seed", type=int, default=0, help="PRNG seed of stochastic methods and --play")
    e.add_argument("--limit", type=int, help="only the first N frames of the input")
    e.add_argument("--objects", nargs="?", const="auto", metavar="FILE",
                   help="also store per-frame object shares (per class: positive and absolute mass, chance, "
                        "per stacked frame; jaxsal.load_object_shares) from the boxes in FILE (.npz: boxes, "
                        "labels, classes; see jaxsal.io.object_files), or without FILE from INPUT.objects.npz beside "
                        "the input (python -m jaxsal_agents.record_objects writes both); with --play, the boxes "
                        "of the rollout")
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
