"""`jaxsal agents`: the shipped agents, or the layers of any agent (--layers SPEC); `jaxsal agents fetch`:
the weights of shipped agents that this install lacks (the wheel carries only the demo agent's)."""
from __future__ import annotations

from jaxsal.cli._agent import check_agent, load_agent


def cmd_layers(spec: str, layout: str | None) -> int:
    """Print the layers of an agent (module path, kind, output shape): the names `layer=` takes."""
    import jax
    import jax.numpy as jnp

    from jaxsal.backprop.layers import layer_calls, resolve_layer

    agent = load_agent(spec, None, layout)
    shape = tuple(agent.card.get("obs_shape") or ((4, 84, 84) if agent.layout == "NCHW" else (84, 84, 4)))
    check_agent(agent, (1,) + shape, layout)  # a channel-first model without --layout: says so, as explain does
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


FETCH = "jaxsal agents fetch NAME|all --from DIR_OR_URL"
"""The fetch command's form, as the listing and the help name it."""


def cmd_agents(args) -> int:
    """List the shipped agents, each with its game, network, training and return, marking those whose
    weights this install lacks (and naming the command that fetches them); or an agent's layers."""
    from jaxsal.errors import CLIError
    from jaxsal.plugins import agent_provider

    if args.layers:
        return cmd_layers(args.layers, args.layout)
    if args.layout:
        raise CLIError("--layout goes with --layers SPEC (the layout of that agent's model); "
                       "`jaxsal agents` alone lists the shipped agents")

    provider = agent_provider()
    names = provider.available()
    if not names:
        print(f"the agents provider {provider.name!r} ships no agents yet; use --agent CARD.json --model PARAMS.msgpack")
        return 0
    missing = [n for n in names if not provider.installed(n)]
    for name in names:
        card = provider.card(name)
        ev = card.get("eval") or {}
        ret = (f" return={ev['mean_return']:.1f}+-{ev.get('std_return', 0):.1f} over {ev.get('episodes')} games"
               if "mean_return" in ev else "")
        steps = _trained(card)
        fetch = "  [weights not installed]" if name in missing else ""
        print(f"{name:24s} game={card.get('game')} arch={card.get('arch')} actions={card.get('num_actions')}"
              f"{steps}{ret}{fetch}")
    if missing:
        print(f"weights not installed for {len(missing)} of {len(names)} agents; fetch them: {FETCH} "
              "(a jaxsal checkout's agents/shipped folder, or its URL)")
    return 0


def cmd_fetch(args) -> int:
    """Fetch each named agent's weights (or every missing one with `all`), checked, then say where they are."""
    from jaxsal.errors import CLIError
    from jaxsal.plugins import agent_provider

    provider = agent_provider()
    names = [n for n in provider.available() if not provider.installed(n)] if args.names == ["all"] else args.names
    unknown = [n for n in names if n not in provider.available()]
    if unknown:
        raise CLIError(f"unknown agent {unknown[0]!r}; shipped agents: {', '.join(provider.available())} (or all)")
    for name in names:
        path, fetched = provider.fetch(name, args.source)
        print(f"{name}: {'fetched into' if fetched else 'already installed at'} {path}")
    return 0


USAGE = "%(prog)s [-h] [--layers SPEC [--layout {NHWC,NCHW}]]\n       %(prog)s fetch NAME [NAME ...]|all --from DIR_OR_URL"

DESCRIPTION = """\
List the shipped agents (game, network, training, return), marking those whose weights this install
lacks; with --layers SPEC, print the layers of any agent; with fetch, bring shipped agents' weights.

examples:
  jaxsal agents
  jaxsal agents --layers breakout
  jaxsal agents fetch pong --from path/to/jaxsal/agents/shipped"""


def add_parser(sub):
    """The `jaxsal agents` command, its flags and its one subcommand (fetch)."""
    import argparse

    a = sub.add_parser("agents", help="list the shipped agents (marking those not installed), an agent's layers "
                                      "(--layers SPEC), or fetch weights (fetch)",
                       usage=USAGE, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--layers", metavar="SPEC", help="print the layer names (for layer= / --option M.layer=) "
                                                    "of any agent SPEC, and the CAM methods' default")
    a.add_argument("--layout", choices=["NHWC", "NCHW"], help="with --layers: the model's input layout, "
                                                              "overriding the agent's")
    a.set_defaults(fn=cmd_agents)
    sub_a = a.add_subparsers(dest="agents_command", title="subcommand (optional)", metavar="fetch",
                             prog="jaxsal agents", help=f"copy or download shipped agents' weights that this "
                                                        f"install lacks: {FETCH}")
    f = sub_a.add_parser("fetch", usage="%(prog)s [-h] NAME [NAME ...]|all --from DIR_OR_URL",
                         description="Copy or download the weights of shipped agents (the wheel carries only the "
                                     "demo agent's, breakout) into the user's cache (JAXSAL_CACHE_DIR, else "
                                     "~/.cache/jaxsal), kept only when size and sha256 equal the manifest's.")
    f.add_argument("names", nargs="+", metavar="NAME", help="shipped agent names (`jaxsal agents` lists them), or "
                                                            "all: every one this install lacks")
    f.add_argument("--from", dest="source", required=True, metavar="DIR_OR_URL", help=FROM_HELP)
    f.set_defaults(fn=cmd_fetch)


FROM_HELP = ("a folder holding the weight files (a jaxsal checkout's agents/shipped) or its URL (file://, "
             "https://); required: the project publishes no release address yet")
