"""`jaxsal demo`: play Breakout with the shipped agent, explain every frame, write a gallery and a video."""
from __future__ import annotations

import shutil
import time
from pathlib import Path

from jaxsal.cli._agent import load_agent
from jaxsal.cli._common import say, summary_lines
from jaxsal.cli._input import play
from jaxsal.errors import CLIError


DEMO_METHODS = ("gradcam", "guided_backprop", "gradient", "occlusion")
DEMO_OPTIONS = {"gradcam": {"layer": "conv3"}, "occlusion": {"patch": 6, "stride": 6, "score": "drop"}}


def cmd_demo(args) -> int:
    from jaxsal.io import MethodSpec, run_job
    from jaxsal.plugins import agent_provider
    from jaxsal.io.store import MANIFEST, read_manifest
    from jaxsal.cli.render.gallery import render_dir

    import jaxsal

    from jaxsal.agent_spec import as_agent

    t0 = time.perf_counter()
    if args.agent:
        agent = load_agent(args.agent, None, args.layout)
        say(f"loaded agent {agent.name} ({agent.layout})", args.quiet)
    elif "breakout" in agent_provider().available():
        agent = as_agent(agent_provider().load("breakout"), default_name="breakout")
        say(f"loaded the shipped Breakout agent ({agent.card.get('algorithm', agent.card.get('arch'))})",
            args.quiet)
    else:
        agent = as_agent(agent_provider().random_agent("breakout", args.seed),
                         default_name="breakout-random-init")
        say("the shipped Breakout agent is not available yet (agents/shipped/breakout.json); using an "
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
    for line in summary_lines(summary):
        say(line, args.quiet)
    say(f"demo done in {time.perf_counter() - t0:.1f}s. Look at: {res['html'].absolute()}\n"
        f"  video: {res['videos'][0].absolute()}\n  maps: jaxsal.load_maps('{out}', '{names[0]}')", args.quiet)
    return 0


def add_parser(sub):
    """The `jaxsal demo` command and its flags."""
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
