"""Every example in the CLI's help texts runs as written (issue 46): each `jaxsal ...` and
`python -m jaxsal_agents...` line of `jaxsal [COMMAND] --help` parses with the real parser, and the
names in it (methods, their options, targets, shipped agents, layers, the sweep config's keys and
metrics) are ones the registry, the targets and the sweep planner accept. Nothing is computed."""
from __future__ import annotations

import re
import shlex
import shutil
import tomllib

import numpy as np
import pytest

import jaxsal
import jaxsal.plugins
from jaxsal.cli import build_parser, main
from jaxsal.cli.explain import parse_methods, parse_options
from jaxsal.errors import CLIError
from jaxsal.io import sweep as sw
from jaxsal.io.job import MethodSpec, check_specs
from jaxsal.targets import TARGET_NAMES, get_target
from tests._support import ROOT

SHIPPED = ROOT / "agents" / "shipped"
COMMANDS = ("explain", "sweep", "render", "agents", "demo")
COMMAND = re.compile(r"^(?:\w+: )?((?:jaxsal|python -m jaxsal_agents\.\w+) .*?)(?:\s{2,}.*| \(.*)?$")
INLINE = re.compile(r"\(e\.g\. (jaxsal [^)]+)\)")
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_.=]*$|^[A-Z]+/")   # SPEC, DIR, METHOD.NAME=VALUE, DIR/obs.npy


@pytest.fixture(scope="module")
def helps():
    """{'': jaxsal --help, 'explain': jaxsal explain --help, ...}, unwrapped (one paragraph a line)."""
    import os
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "1000"  # argparse wraps at the terminal's width: a command on one line
    try:
        p = build_parser()
        out = {"": p.format_help(), **{c: _sub(p, c).format_help() for c in COMMANDS}}
    finally:
        os.environ.pop("COLUMNS") if old is None else os.environ.__setitem__("COLUMNS", old)
    return out


def _sub(parser, command: str):
    return next(a for a in parser._actions if a.dest == "command").choices[command]


def _examples(text: str) -> list[str]:
    """The command lines of a help text (past its usage): a line that is one (after a `label: `), or
    one given `(e.g. jaxsal ...)`; prose that names a command in passing is not an example."""
    body = text.split("\n\n", 1)[1]
    lines = [line.strip() for line in body.splitlines()]
    return [m[1] for line in lines if (m := COMMAND.match(line))] + INLINE.findall(body)


def _given(v) -> bool:
    return isinstance(v, str) and not PLACEHOLDER.match(v)


def _layers(agent: str, capsys) -> set[str]:
    assert main(["agents", "--layers", agent]) == 0
    return {line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]}


def _check_jaxsal(argv: list[str], capsys):
    """Parse argv with the real parser and check the names it carries."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit:
        raise AssertionError(f"`jaxsal {shlex.join(argv)}` does not parse: {capsys.readouterr().err}") from None
    if _given(getattr(args, "methods", None)):
        pairs = parse_methods(args.methods)
        opts = parse_options(args.option, [a for a, _ in pairs])
        check_specs([MethodSpec(a, m, opts[a]) for a, m in pairs])
    if getattr(args, "target", None) is not None:
        get_target(args.target)
    for spec in (getattr(args, "agent", None), getattr(args, "layers", None)):
        if _given(spec) and re.fullmatch(r"[a-z][\w-]*", spec):
            assert spec in jaxsal.plugins.agent_provider().available(), spec
    return args


def test_the_help_texts_have_examples(helps):
    """The test reads what it should: the examples a user sees."""
    found = {c: _examples(t) for c, t in helps.items()}
    assert len(found["explain"]) == 6 and found["sweep"] == ["jaxsal render DIR"], found
    assert "jaxsal agents --layers breakout" in found["explain"]


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_every_example_parses_and_names_what_exists(helps, command, capsys):
    for line in _examples(helps[command]):
        words = shlex.split(line)
        if words[0] == "jaxsal":
            _check_jaxsal(words[1:], capsys)
        else:
            from jaxsal_agents.record_objects import parser
            from jaxsal.game_objects import games
            args = parser().parse_args(words[3:])
            if args.agent:
                assert args.agent in jaxsal.plugins.agent_provider().available(), line
                assert jaxsal.plugins.agent_provider().card(args.agent)["game"] in games(), line


def test_the_option_and_target_examples_exist(helps, capsys):
    """`--option` e.g. values name real options and the shipped agents' layers; `--target` and
    the epilog list every target; `--methods` lists (e.g., defaults) name registered methods."""
    text = helps["explain"] + helps["demo"]
    options = set(re.findall(r"\b([a-z_]+)\.([a-z_]+)=(\w+)", text))
    assert {("rise", "n_masks", "500"), ("gradcam", "layer", "conv3")} <= options
    layers = _layers("breakout", capsys) & _layers("pong", capsys)
    for method, name, value in options:
        check_specs([MethodSpec(method, method, parse_options([f"{method}.{name}={value}"], [method])[method])])
        if name == "layer":
            assert value in layers, (value, layers)
    target_help = next(a.help for a in _sub(build_parser(), "explain")._actions if a.dest == "target")
    for listed in (target_help, helps["explain"].split("targets: ")[1].split("(")[0]):
        assert set(TARGET_NAMES) <= set(re.findall(r"[a-z_]+", listed)), listed
    lists = re.findall(r"(?:e\.g\.|default:)\s+([a-z_0-9]+(?:,[a-z_0-9]+)+)", text)
    assert lists and all(m in jaxsal.methods() for ms in lists for m in ms.split(",")), lists
    code = re.search(r"python -c '(.+?)'", helps["explain"])[1]
    exec(code, {})
    assert capsys.readouterr().out.startswith("{'n_masks': ")


def test_the_sweep_config_in_the_help_is_a_valid_config(helps, tmp_path):
    """The config lines of `jaxsal sweep --help` parse as TOML and pass the planner's checks, with
    the files they name in place; its metrics line names every metric."""
    block = helps["sweep"].split("config (TOML")[1].split("\n", 1)[1].split("\noutputs:")[0]
    raw = tomllib.loads("\n".join(line[2:] for line in block.splitlines()))
    assert set(raw) <= set(sw.TOP_KEYS)
    np.save(tmp_path / "buffer.npy", np.zeros((2, 84, 84, 4), np.uint8))
    (tmp_path / "runs" / "pong").mkdir(parents=True)
    for step in ("step_1", "step_2"):  # a glob's checkpoints, each with its card
        for suffix in (".msgpack", ".json"):
            shutil.copy(SHIPPED / f"pong{suffix}", tmp_path / "runs" / "pong" / f"{step}{suffix}")
    cells, metrics, _ = sw.plan(raw, tmp_path)
    assert metrics == raw["metrics"] and {c.method for c in cells} == {"gradcam", "occlusion"}
    assert {c.agent for c in cells} == {"breakout", "pong"} and len(cells) == 3 * 2 * 2, cells
    metrics_line = next(line for line in block.splitlines() if "metrics =" in line)
    assert set(re.findall(r"[a-z]+", metrics_line)) >= set(sw.METRICS), metrics_line
    ray = re.search(r"--ray (local:\d+)", helps["sweep"])[1]
    assert build_parser().parse_args(["sweep", "s.toml", "--out", "o", "--ray", ray]).ray == ray


def test_a_stale_example_is_caught(capsys):
    """The checks fail on the mistakes they are for: a flag, a method, an option, a target."""
    for argv in (["explain", "--agent", "pong", "--methods", "gradcam", "--out", "o", "--frobnicate"],
                 ["explain", "--agent", "pong", "--methods", "gradcamm", "--input", "b.npy", "--out", "o"],
                 ["explain", "--agent", "pong", "--methods", "rise", "--option", "rise.masks_n=5", "--out", "o"],
                 ["explain", "--agent", "pong", "--methods", "rise", "--target", "q_chose", "--out", "o"],
                 ["explain", "--agent", "pongg", "--methods", "rise", "--out", "o"]):
        with pytest.raises((AssertionError, jaxsal.SaliencyInputError, CLIError)):
            _check_jaxsal(argv, capsys)
