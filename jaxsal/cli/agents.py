"""`jaxsal agents`: the shipped agents, or the layers of any agent (--layers SPEC)."""
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


def add_parser(sub):
    """The `jaxsal agents` command and its flags."""
    a = sub.add_parser("agents", help="list the shipped agents, or an agent's layers (--layers SPEC)")
    a.add_argument("--layers", metavar="SPEC", help="print the layer names (for layer= / --option M.layer=) "
                                                    "of any agent SPEC, and the CAM methods' default")
    a.add_argument("--layout", choices=["NHWC", "NCHW"], help="the model's input layout, overriding the agent's")
    a.set_defaults(fn=cmd_agents)
