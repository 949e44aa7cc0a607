"""`jaxsal agents`: alone it lists the shipped agents, marking those whose weights this install lacks and
naming the command that fetches them; its help names both forms (the listing and `fetch`) plainly."""
import os

from jaxsal.cli import build_parser, main
from jaxsal.plugins import agent_provider
from tests._support import wheel_install as wheel

FETCH = "jaxsal agents fetch NAME|all --from DIR_OR_URL"


def _help(*words) -> str:
    parser, old = build_parser(), os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "200"  # one line per entry: the checks read lines
    try:
        for w in words:
            parser = next(a for a in parser._actions if a.choices and w in a.choices).choices[w]
        return parser.format_help()
    finally:
        os.environ.pop("COLUMNS") if old is None else os.environ.__setitem__("COLUMNS", old)


def test_the_help_names_the_listing_and_fetch_and_needs_no_subcommand():
    text = _help("agents")
    usage = text.split("\n\n")[0]
    assert usage.splitlines() == ["usage: jaxsal agents [-h] [--layers SPEC [--layout {NHWC,NCHW}]]",
                                  "       jaxsal agents fetch NAME [NAME ...]|all --from DIR_OR_URL"], usage
    assert "{fetch}" not in text and "subcommand (optional):" in text, text
    line = next(line for line in text.splitlines() if line.strip().startswith("fetch "))
    assert "weights" in line and FETCH in line, line            # the subcommand says what it does, in its form
    assert "List the shipped agents" in text and "jaxsal agents fetch pong --from " in text
    assert _help("agents", "fetch").startswith("usage: jaxsal agents fetch [-h] NAME [NAME ...]|all --from DIR_OR_URL")
    args = build_parser().parse_args(["agents"])
    assert args.agents_command is None and args.fn.__name__ == "cmd_agents"


def _listed(capsys) -> list[str]:
    capsys.readouterr()
    assert main(["agents"]) == 0
    return capsys.readouterr().out.splitlines()


def test_alone_it_lists_every_agent_and_which_weights_are_installed(tmp_path, capsys):
    names = agent_provider().available()
    assert len(names) > 1
    lines = _listed(capsys)                                     # a checkout: every agent's weights are here
    assert [line.split()[0] for line in lines] == names and not any("not installed" in line for line in lines)
    with wheel.installed_as_wheel(wheel.make(tmp_path)):       # a wheel's install: only the demo agent's
        lines = _listed(capsys)
    *agents, last = lines
    assert [line.split()[0] for line in agents] == names, lines
    for line in agents:
        assert line.endswith("[weights not installed]") == (line.split()[0] != wheel.DEMO), line
    assert f"for {len(names) - 1} of {len(names)} agents" in last and FETCH in last, last


def test_layout_without_layers_is_an_error_naming_the_fix(capsys):
    assert main(["agents", "--layout", "NCHW"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--layout goes with --layers SPEC" in err, err
