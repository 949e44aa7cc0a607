"""docs/troubleshooting.md is tested against the CLI's errors: every bad-input case of
tests/cli/test_bad_input.py prints a message the page explains (a heading is part of it), and the
page explains no message the CLI no longer prints."""
import re

from tests._support.bad_inputs import cases, run
from tests._support import ROOT

PAGE = ROOT / "docs" / "troubleshooting.md"


def test_every_cli_error_is_on_the_page_and_the_page_only_has_real_ones(bad_inputs, tmp_path, capsys):
    text = PAGE.read_text()
    headings = re.findall(r"^### `(.+)`$", text, re.M)
    assert len(headings) >= 10
    examples = re.findall(r"^```text\n(.+?)\n```$", text, re.M | re.S)
    assert examples and all(e.startswith("jaxsal: error: ") and "\n" not in e for e in examples)
    d, card, atari = bad_inputs
    printed = {}
    for i, (name, (argv, _, _)) in enumerate(cases(d, card, atari).items()):
        capsys.readouterr()
        assert run(d, name, argv + ["--out", str(tmp_path / f"o{i}")]) == 2, name
        printed[name] = capsys.readouterr().err.strip()
    unexplained = [name for name, msg in printed.items() if not any(h in msg for h in headings)]
    assert not unexplained, f"CLI errors the page does not explain: {unexplained}"
    stale = [h for h in headings if not any(h in msg for msg in printed.values())]
    assert not stale, f"page headings no CLI error contains any more: {stale}"
    for e in examples:  # each example is one of the headings' messages
        assert any(h in e for h in headings), e
