"""Two commits of this repository side by side: a detached worktree per commit, for the before/after
benchmarks (experiments.benchmarks.engine_ab, experiments.paper_b.cost)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(os.environ.get("JAXSAL_AB_ROOT", Path(__file__).resolve().parents[2]))
"""The repository whose commits are checked out (JAXSAL_AB_ROOT overrides it)."""


def checkout_at(commit: str, where: Path) -> tuple[Path, str]:
    """A detached worktree of `commit` at `where`: (its path, the commit's full hash)."""
    sha = subprocess.run(["git", "rev-parse", commit], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.strip()
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(where), sha], cwd=ROOT, check=True)
    return where, sha


def remove(where: Path) -> None:
    """Remove a worktree made by checkout_at (never raises: a cleanup step)."""
    subprocess.run(["git", "worktree", "remove", "--force", str(where)], cwd=ROOT, check=False)


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def _import_paths(checkout: Path) -> list[str]:
    """sys.path entries that import `jaxsal` and `jaxsal_agents` from `checkout`: the agents package lives in
    agents/, which the editable install maps to jaxsal_agents, so a link of that name is made next to the
    checkout (else every side would load the shipped agents with the installed tree's code)."""
    paths = [str(checkout)]
    if (checkout / "agents" / "__init__.py").exists():
        shim = checkout.parent / f"{checkout.name}-imports"
        shim.mkdir(exist_ok=True)
        link = shim / "jaxsal_agents"
        if not link.is_symlink():
            link.symlink_to(checkout / "agents", target_is_directory=True)
        paths.insert(0, str(shim))
    return paths


class Worker:
    """A persistent worker process running `script` from one checkout, driven by JSON lines: its first
    line says which jaxsal it imported ({"ready": path, ...}), each request gets one JSON line back."""

    def __init__(self, label: str, checkout: Path, script: Path, xla_flags: str | None = None):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(_import_paths(checkout)))
        if xla_flags is not None:   # this side's XLA_FLAGS (jaxsal keeps a YNN flag it finds there)
            env["XLA_FLAGS"] = xla_flags
        self.label = label
        self.proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env, cwd=checkout)
        self.hello = json.loads(self.proc.stdout.readline())
        for what in ("ready", "agents"):  # jaxsal, and jaxsal_agents where the script reports it
            if not self.hello.get(what, str(checkout)).startswith(str(checkout)):
                raise SystemExit(f"{label}: imported {'jaxsal' if what == 'ready' else 'jaxsal_agents'} from "
                                 f"{self.hello[what]}, not {checkout}")

    def ask(self, **req) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"{self.label}: worker died on {req}")
        return json.loads(line)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
