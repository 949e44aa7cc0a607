"""The shipped agents' weights: a manifest that matches the files, a wheel that carries only the demo
agent's, one error naming `jaxsal agents fetch` for the others, and a fetch that keeps a file only
when its sha256 is the manifest's (from a folder or a file:// URL, never a partial file)."""
import json
import shutil
from pathlib import Path

import pytest

import jaxsal_agents
from jaxsal.cli import main
from jaxsal_agents import weights

from tests._support import ROOT
from tests._support import wheel_install as wheel
SHIPPED = ROOT / "agents" / "shipped"
SMALL = "minatar-breakout"          # 0.4 MB: quick to copy


def test_the_manifest_lists_every_shipped_agent_with_its_files_size_and_sha256():
    entries = weights.manifest()
    cards = {p.stem for p in SHIPPED.glob("*.json") if p.name != weights.MANIFEST}
    assert set(entries) == cards, "rewrite it: python -m jaxsal_agents.weights"
    for name, e in entries.items():
        f = SHIPPED / e["file"]
        assert e["file"] == f"{name}.msgpack" and f.stat().st_size == e["bytes"], name
        assert weights.sha256_file(f) == e["sha256"] == json.loads((SHIPPED / f"{name}.json").read_text())[
            "params_sha256"], f"{name}: rewrite the manifest (python -m jaxsal_agents.weights)"
    assert jaxsal_agents.available() == sorted(cards)


@pytest.fixture
def wheel_install(tmp_path):
    """This install seen as the wheel's (tests/_support/wheel_install.py); yields the cache's agents folder."""
    with wheel.installed_as_wheel(wheel.make(tmp_path / "site")) as cache:
        yield cache


def test_a_missing_agent_is_one_error_naming_the_fetch_command(wheel_install, capsys):
    assert weights.find("breakout") is not None and weights.find(SMALL) is None
    with pytest.raises(jaxsal_agents.AgentLoadError, match=f"jaxsal agents fetch {SMALL} --from DIR_OR_URL"):
        jaxsal_agents.load(SMALL)
    capsys.readouterr()
    assert main(["agents", "--layers", SMALL]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"jaxsal agents fetch {SMALL}" in err and "not installed" in err, err
    assert main(["agents"]) == 0
    listed = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "not installed" in listed[SMALL] and "not installed" not in listed["breakout"]


def test_a_sweep_of_a_missing_agent_is_refused_before_it_starts(wheel_install, tmp_path):
    from jaxsal.io import sweep as sw

    with pytest.raises(sw.SweepConfigError, match=f"agents\\[1\\]: .*jaxsal agents fetch {SMALL} --from"):
        sw.plan_agents({"agents": ["breakout", SMALL]}, tmp_path)


@pytest.mark.parametrize("url", [False, True], ids=["folder", "file-url"])
def test_fetch_from_a_folder_or_a_file_url_then_the_agent_loads(wheel_install, capsys, url):
    source = SHIPPED.as_uri() if url else str(SHIPPED)
    assert main(["agents", "fetch", SMALL, "--from", source]) == 0
    dest = wheel_install / f"{SMALL}.msgpack"
    assert f"fetched into {dest}" in capsys.readouterr().out
    assert dest.read_bytes() == (SHIPPED / f"{SMALL}.msgpack").read_bytes()
    assert [p.name for p in wheel_install.iterdir()] == [dest.name]            # no temporary file left
    assert jaxsal_agents.load(SMALL).params is not None
    assert main(["agents", "fetch", SMALL, "breakout", "--from", source]) == 0  # nothing to do for either
    assert capsys.readouterr().out.count("already installed at") == 2


@pytest.mark.parametrize("damage", ["flipped", "short", "long"])
def test_a_file_other_than_the_manifests_is_refused_and_nothing_written(wheel_install, tmp_path, capsys, damage):
    data = bytearray((SHIPPED / f"{SMALL}.msgpack").read_bytes())
    data = {"flipped": lambda d: d[:100] + bytes([d[100] ^ 1]) + d[101:], "short": lambda d: d[:-1],
            "long": lambda d: d + b"\0"}[damage](data)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / f"{SMALL}.msgpack").write_bytes(data)
    assert main(["agents", "fetch", SMALL, "--from", str(tmp_path / "src")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "sha256" in err and "nothing was written" in err, err
    assert not wheel_install.exists() or not any(wheel_install.iterdir())     # no partial file, no temporary
    with pytest.raises(jaxsal_agents.AgentLoadError, match="not installed"):
        jaxsal_agents.load(SMALL)


def test_fetch_says_what_is_wrong_with_the_source_or_the_name(wheel_install, tmp_path, capsys):
    for argv, words in ((["pong", "--from", str(tmp_path / "nowhere")], "no such folder"),
                        (["pong", "--from", str(tmp_path)], "holds no pong.msgpack"),
                        (["pong", "--from", (tmp_path / "nowhere").as_uri()], "cannot download"),
                        (["pongg", "--from", str(SHIPPED)], "unknown agent 'pongg'")):
        assert main(["agents", "fetch", *argv]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and words in err, (argv, err)
    with pytest.raises(SystemExit):                                            # --from is required
        main(["agents", "fetch", "pong"])
    assert "--from" in capsys.readouterr().err


def test_fetch_all_brings_every_missing_agent(wheel_install, capsys):
    assert main(["agents", "fetch", "all", "--from", str(SHIPPED)]) == 0
    assert sorted(p.stem for p in wheel_install.iterdir()) == sorted(set(weights.manifest()) - {"breakout"})
    assert all(weights.find(n) is not None for n in weights.manifest())


def test_exporting_into_a_folder_with_a_manifest_rewrites_it(tmp_path):
    for f in (f"{SMALL}.json", f"{SMALL}.msgpack"):
        shutil.copy(SHIPPED / f, tmp_path / f)
    weights.refresh_manifest(tmp_path)                          # no manifest there: left alone
    assert not (tmp_path / weights.MANIFEST).exists()
    weights.write_manifest(tmp_path)
    (tmp_path / f"{SMALL}.msgpack").write_bytes(b"new weights")
    weights.refresh_manifest(tmp_path)
    e, = weights.manifest(tmp_path).values()
    assert e["bytes"] == len(b"new weights") and e["sha256"] == weights.sha256_file(tmp_path / f"{SMALL}.msgpack")


def test_fetch_replaces_a_cached_file_that_is_not_the_manifests(wheel_install, capsys):
    """A stale or damaged file in the cache is not "already installed": fetch puts the manifest's file there."""
    wheel_install.mkdir(parents=True, exist_ok=True)
    (wheel_install / f"{SMALL}.msgpack").write_bytes(b"stale weights")
    assert main(["agents", "fetch", SMALL, "--from", str(SHIPPED)]) == 0
    assert "already installed" not in capsys.readouterr().out
    assert (wheel_install / f"{SMALL}.msgpack").read_bytes() == (SHIPPED / f"{SMALL}.msgpack").read_bytes()
    assert jaxsal_agents.load(SMALL).params is not None
