"""The agent of an --agent SPEC, and the checks of it against the frames it will explain, in the
command line's words."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from jaxsal.errors import CLIError


AGENT_HELP = ("shipped agent name (see `jaxsal agents`), an agent card .json, a .msgpack with its card "
              "beside it, a checkpoint file (.cleanrl_model, torch .pth/.pt, a Stable-Baselines3 or SBX .zip), "
              "or path/to/file.py:FUNCTION / "
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


def check_frames(agent, shape):
    """Frames (in the model's layout) must have the shape the agent's card says."""
    from jaxsal.io.layout import to_nhwc_shape

    want = tuple(agent.card.get("obs_shape", ()))
    if want and len(shape) == 4:
        got_hwc = to_nhwc_shape(shape, agent.layout)[1:]
        want_hwc = to_nhwc_shape((1,) + want, agent.layout)[1:]
        if got_hwc != want_hwc:
            raise CLIError(f"input frames have shape {tuple(shape[1:])} but agent {agent.name!r} expects "
                           f"{want} ({agent.layout}); was the buffer recorded for another game or preprocessing?")


def check_buffer_actions(agent, source, num_actions):
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


def check_agent(agent, shape, layout_given: str | None, target: str | None = None):
    """The library's model check (jaxsal.checks.check_model: one abstract forward pass, no
    compilation) on a frame stack of `shape` (model layout), before anything is written, in the
    CLI's words: a model that takes the other layout or fails on these frames, a target its
    output cannot give (e.g. value on a Q-network), or an action count other than the agent
    declares. Returns the output shapes."""
    from jaxsal import checks

    try:
        out = checks.check_model(agent.apply_fn, agent.params, shape, layout=agent.layout,
                                 target=target or "q_chosen")
    except checks.ModelFails as e:
        error = e.error.partition(":")[0]
        if e.layout is not None:
            fix = f"add --layout {e.layout}" if layout_given is None else f"use --layout {e.layout}"
            raise CLIError(f"agent {agent.name!r} takes {checks.KINDS[e.layout]} frames (N, {', '.join(map(str, e.alt_shape[1:]))}): "
                           f"{fix} (on {checks.KINDS[agent.layout]} frames {e.shape} it fails: {error})") from None
        check_frames(agent, shape)  # frames of another size than the card's: that says it best
        raise CLIError(f"agent {agent.name!r} fails on one frame stack of shape {e.shape} ({agent.layout}): {e.error}; "
                       "check that --agent and --input (and --layout) belong together") from None
    except checks.TargetFails as e:
        raise CLIError(f"--target {target}: {e}; choose another --target (see jaxsal explain --help)") from None
    except checks.ActionsDisagree as e:  # the library's check, naming the agent
        raise CLIError(str(checks.ActionsDisagree(e.declared, e.outputs, f"agent {agent.name!r}"))) from None
    return out


def check_layers(agent, specs, source):
    """Layers named with --option M.layer=NAME must exist in the model and be spatial."""
    from jaxsal.errors import SaliencyInputError
    from jaxsal.backprop.layers import resolve_layer
    from jaxsal.engine import expression
    from jaxsal.registry import accepted_options

    x = None
    for s in specs:
        layer = s.options.get("layer")
        if layer is None or "layer" not in accepted_options(expression.function(s.method)):
            continue
        if x is None:
            x = np.zeros((1,) + tuple(source.shape[1:]), np.float32)
        try:
            resolve_layer(agent.apply_fn, agent.params, x, layer)
        except SaliencyInputError as e:
            raise CLIError(f"--option {s.alias}.layer={layer}: {e}") from None
