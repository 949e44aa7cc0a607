"""Every code block of the README and the documentation runs as written (issue 46).

Each page runs top to bottom in a fresh process, in a temporary folder of its own, as a reader would
run it: its ```python blocks in one namespace, its ```bash blocks (`jaxsal ...`, `python -m ...`) in
that folder. A block that is not run carries `<!-- not-run: REASON -->`; a block that is a file the
page's commands read carries `<!-- file: NAME -->`; tiny real files a reader has of their own (a
buffer, another library's checkpoint) are declared on the page by `<!-- test-files: NAME, ... -->`
and made here (FILES). The conventions are in tests/_support/docs_blocks.py. A few quick pages run in the
fast loop (FAST); the others are slow.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests._support.docs_blocks import blocks, runs, declared_files, unmarked
from tests._support import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHIPPED = ROOT / "agents" / "shipped"

# the pages the fast loop runs, with their seconds (one process on a busy 2-core machine, XLA at -O0):
# the README, the front door; every other page is slow (together about 13 minutes of CPU), run by CI
FAST = {
    "README.md": 31,
}


def _frames(n: int, seed: int = 0) -> np.ndarray:
    """n stacks of 4 Atari-sized frames, uint8 (N, 84, 84, 4)."""
    return np.random.default_rng(seed).integers(0, 256, (n, 84, 84, 4), dtype=np.uint8)


def _npz(d: Path):
    np.savez(d / "buffer.npz", obs=_frames(4))


def _npy(d: Path):
    np.save(d / "buffer.npy", _frames(4))


def _pong_checkpoints(d: Path):
    """Two checkpoints of the shipped Pong agent, each with its card beside it (a glob's checkpoints)."""
    (d / "runs" / "pong").mkdir(parents=True)
    for step in ("step_1000", "step_2000"):
        shutil.copy(SHIPPED / "pong.msgpack", d / "runs" / "pong" / f"{step}.msgpack")
        shutil.copy(SHIPPED / "pong.json", d / "runs" / "pong" / f"{step}.json")


def _cleanrl(d: Path):
    """The files CleanRL's dqn_atari_jax.py and ppo_atari_envpool_xla_jax.py save, from their networks."""
    import flax.serialization
    import jax

    from tests._support import foreign_agents as F
    frames = F.atari_nchw(1)
    q = F.QNetwork(action_dim=4)
    (d / "runs" / "Breakout").mkdir(parents=True)
    (d / "runs" / "Breakout" / "dqn_atari_jax.cleanrl_model").write_bytes(
        flax.serialization.to_bytes(q.init(jax.random.PRNGKey(1), frames)))
    shutil.copy(d / "runs" / "Breakout" / "dqn_atari_jax.cleanrl_model", d / "dqn_atari_jax.cleanrl_model")
    net, actor, critic = F.Network(), F.Actor(action_dim=4), F.Critic()
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(2), 3)
    net_params = net.init(k1, frames)
    h = net.apply(net_params, frames)
    args = {"env_id": "Breakout-v5", "seed": 1}
    (d / "ppo_atari_envpool_xla_jax.cleanrl_model").write_bytes(
        flax.serialization.to_bytes([args, [net_params, actor.init(k2, h), critic.init(k3, h)]]))


def _sb3_sbx(d: Path):
    """A DQN of Stable-Baselines3 (torch) and one of SBX, CnnPolicy, trained briefly and saved by each library."""
    for lib in ("stable_baselines3", "sbx"):
        pytest.importorskip(lib, reason="the clients extra: `make test-slow` installs it")
    from tests._support import client_models as C
    C.sb3_dqn(100).save(d / "sb3_dqn_breakout.zip")
    C.sbx_dqn(100).save(d / "sbx_dqn_breakout.zip")


FILES = {
    "buffer.npz": _npz,
    "buffer.npy": _npy,
    "runs/pong/*.msgpack": _pong_checkpoints,
    "CleanRL checkpoints": _cleanrl,
    "SB3 and SBX models": _sb3_sbx,
}


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def _runnable_pages():
    for p in PAGES:
        if any(runs(b) for b in blocks(p)):
            yield pytest.param(p, id=_rel(p),
                               marks=[] if _rel(p) in FAST else [pytest.mark.slow])


def test_every_block_runs_or_says_why_not():
    bad = [f"{b.name}: {why}" for p in PAGES for b in blocks(p, _rel(p)) if (why := unmarked(b))]
    assert not bad, "\n".join(bad)


def test_every_declared_test_file_is_made_here_and_fast_pages_exist():
    unknown = [f"{_rel(p)}: {n}" for p in PAGES for n in declared_files(p) if n not in FILES]
    assert not unknown, f"test-files no FILES entry makes: {unknown}"
    assert all((ROOT / page).is_file() for page in FAST), FAST


@pytest.mark.parametrize("page", _runnable_pages())
def test_the_page_runs_top_to_bottom(page, tmp_path):
    for name in declared_files(page):
        FILES[name](tmp_path)
    env = dict(os.environ, MPLBACKEND="Agg")
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "_support" / "docs_blocks.py"), str(page), _rel(page)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, f"{_rel(page)} fails as written:\n{r.stderr[-4000:]}\n{r.stdout[-1000:]}"


def test_explain_help_lists_every_method(capsys):
    """docs/guides/batch.md says `jaxsal explain --help` lists every method."""
    import jaxsal
    from jaxsal.cli import main
    with pytest.raises(SystemExit):
        main(["explain", "--help"])
    methods_line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("methods: "))
    listed = set(methods_line.removeprefix("methods: ").split(", "))
    assert {m for m in jaxsal.methods() if jaxsal.METHODS[m].__module__.startswith("jaxsal.")} <= listed


def test_a_broken_block_fails_naming_its_page_and_block(tmp_path):
    """The runner stops at the first failing block and names the page, the block and its line; a
    not-run block is skipped, a file block is written, and an unmarked `make` block is refused."""
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n<!-- file: conf.txt -->\n```text\nhello\n```\n\n"
                    "```python\nx = open('conf.txt').read()\n```\n\n<!-- not-run: would fail -->\n"
                    "```python\nraise SystemExit(3)\n```\n\n```python\nprint(x, undefined_name)\n```\n\n"
                    "```bash\nmake everything\n```\n")
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "_support" / "docs_blocks.py"), str(page), "page.md"],
                       cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 1, r.stderr
    assert "NameError: name 'undefined_name'" in r.stderr and 'File "page.md", line 18' in r.stderr
    assert "FAILED: page.md, block 4 (```python, line 18)" in r.stderr
    assert [unmarked(b) is not None for b in blocks(page)] == [False, False, False, False, True]
