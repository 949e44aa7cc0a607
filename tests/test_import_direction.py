"""Imports point one way, and the agents package has one name.

cli (the package jaxsal.cli: commands, agent loading, sweep execution, render) -> io (readers,
jobs, loaders, plugins) -> methods (gradient, perturbation, explain, metrics) -> core (errors,
registry, targets, batching, ...); a sweep worker imports no command module; jaxsal never imports the agents
package (it reaches it through the `jaxsal.agents` entry point, jaxsal.plugins); the agents use
only jaxsal's public names; no import cycles inside jaxsal; agents/ imports itself relatively
and is installed as `jaxsal_agents`, the one name every other file uses. Read from the source
(AST), so lazy imports inside functions count too.
"""
from __future__ import annotations

import ast
import json
import re
import tomllib
from pathlib import Path

import pytest

from tests._support import ROOT

AGENT_NAMES = ("agents", "jaxsal_agents")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


JAXSAL = {_module_name(p): p for p in sorted((ROOT / "jaxsal").rglob("*.py"))}


def _imports(path: Path, package: str):
    """(absolute module, imported names or None, line, level) of every import in the file."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, None, node.lineno, 0
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            yield base, [a.name for a in node.names], node.lineno, node.level


def _package(mod: str, path: Path) -> str:
    return mod if path.name == "__init__.py" else mod.rpartition(".")[0]


def _targets(mod: str, path: Path, modules: dict | None = None) -> set[str]:
    """The modules of `modules` (default jaxsal's) that `mod` imports (a `from pkg import sub`
    counts as the submodule), plus the packages above them that are not above `mod`
    (importing them runs their __init__)."""
    modules = JAXSAL if modules is None else modules
    above = {".".join(mod.split(".")[:i]) for i in range(1, mod.count(".") + 1)}
    out = set()
    for base, names, _, _ in _imports(path, _package(mod, path)):
        for t in [base] + [f"{base}.{n}" for n in names or ()]:
            parts = t.split(".")
            out |= {q for q in (".".join(parts[:i]) for i in range(1, len(parts) + 1))
                    if q in modules and q not in above and q != mod}
    return out


GRAPH = {m: _targets(m, p) for m, p in JAXSAL.items()}


def test_jaxsal_never_imports_the_agents_package():
    bad = [f"{p.relative_to(ROOT)}:{line} imports {base}"
           for m, p in JAXSAL.items() for base, _, line, _ in _imports(p, _package(m, p))
           if base.split(".")[0] in AGENT_NAMES]
    assert not bad, "jaxsal must reach agents only through jaxsal.plugins (entry point 'jaxsal.agents'):\n" \
        + "\n".join(bad)


def _layer(mod: str) -> int:
    if mod == "jaxsal.cli" or mod.startswith("jaxsal.cli."):
        return 3
    if mod == "jaxsal" or mod.startswith(("jaxsal.io", "jaxsal.loaders", "jaxsal.plugins", "jaxsal.agent_spec")):
        return 2  # the package front (jaxsal/__init__) re-exports io's load_maps and the loaders
    if mod.startswith(("jaxsal.backprop", "jaxsal.perturbation", "jaxsal.front", "jaxsal.metrics")):
        return 1
    return 0


def test_imports_point_one_way_cli_io_methods_core():
    names = {3: "cli", 2: "io", 1: "methods", 0: "core"}
    bad = [f"{m} ({names[_layer(m)]}) imports {t} ({names[_layer(t)]})"
           for m, ts in GRAPH.items() for t in sorted(ts) if _layer(t) > _layer(m)]
    assert not bad, "imports must point cli -> io -> methods -> core:\n" + "\n".join(bad)


def test_nothing_outside_the_cli_package_imports_it():
    bad = [f"{m} imports {t}" for m, ts in GRAPH.items() if _layer(m) < 3 for t in sorted(ts) if _layer(t) == 3]
    assert not bad, "jaxsal.cli is the top: only its own modules import it:\n" + "\n".join(bad)


def test_every_jaxsal_import_names_a_module_of_jaxsal():
    """A lazy import of a module that moved fails only when its function runs: found here."""
    bad = [f"{p.relative_to(ROOT)}:{line} imports {base}" for m, p in JAXSAL.items()
           for base, _, line, _ in _imports(p, _package(m, p))
           if base.split(".")[0] == "jaxsal" and base not in JAXSAL]
    assert not bad, "\n".join(bad)


COMMANDS = ("jaxsal.cli.explain", "jaxsal.cli.demo", "jaxsal.cli.agents", "jaxsal.cli.sweep", "jaxsal.cli.render")


def _is_command(mod: str) -> bool:
    return mod in COMMANDS or mod.startswith("jaxsal.cli.render.")


def _closure(mod: str) -> set[str]:
    seen, todo = set(), [mod]
    while todo:
        for t in GRAPH[todo.pop()] - seen:
            seen.add(t)
            todo.append(t)
    return seen


def test_sweep_workers_import_no_command_module():
    """A sweep worker (a process of --workers, a Ray task) runs jaxsal.cli.sweep_run: what it imports,
    lazily or not, and what the package jaxsal.cli runs on import hold no command module (parsers,
    galleries): only the agent loading, the inputs, io and jaxsal.errors."""
    assert "jaxsal.cli.sweep_run" in GRAPH and all(c in GRAPH for c in COMMANDS)
    reached = sorted(m for m in _closure("jaxsal.cli.sweep_run") if _is_command(m))
    assert not reached, f"jaxsal.cli.sweep_run reaches command modules: {reached}"
    tree = ast.parse(JAXSAL["jaxsal.cli"].read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]  # module level only
    names = [n.module or "" for n in top if isinstance(n, ast.ImportFrom)]
    names += [a.name for n in top if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in names if _is_command(m)], f"jaxsal/cli/__init__.py imports commands on import: {names}"


def test_the_worker_rule_finds_a_command_import():
    """The rule can fail: what the package's build_parser imports (every command) is found."""
    assert _is_command("jaxsal.cli.render.gallery") and not _is_command("jaxsal.cli.sweep_run")
    assert any(_is_command(m) for m in _closure("jaxsal.cli"))  # the package's build_parser imports them


def _cycles(graph: dict) -> list:
    """The import cycles of a module graph (Tarjan's strongly connected components of size > 1)."""
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycles_inside_jaxsal():
    assert not _cycles(GRAPH), f"import cycles inside jaxsal: {_cycles(GRAPH)}"


def _all_modules() -> dict:
    """Every module of jaxsal/, agents/ (as jaxsal_agents) and experiments/ (not results/)."""
    out = {}
    for folder in ("jaxsal", "agents", "experiments"):
        for p in sorted((ROOT / folder).rglob("*.py")):
            if "results" in p.relative_to(ROOT).parts:
                continue
            name = _module_name(p)
            out["jaxsal_agents" + name[len("agents"):] if folder == "agents" else name] = p
    return out


def test_no_import_cycles_anywhere():
    """Across the library, the agents and the experiments; imports inside functions count (a
    function-local import hides a cycle from Python, not from this test)."""
    modules = _all_modules()
    graph = {m: _targets(m, p, modules) for m, p in modules.items()}
    assert not _cycles(graph), f"import cycles: {_cycles(graph)}"


def _study(mod: str) -> str | None:
    """The study package of an experiments module (experiments.<study>.x -> <study>), else None."""
    parts = mod.split(".")
    return parts[1] if parts[0] == "experiments" and len(parts) > 1 else None


def _cross_study(graph: dict) -> list[str]:
    return [f"{m} imports {t}" for m, ts in graph.items() if _study(m) for t in sorted(ts)
            if _study(t) and _study(t) not in (_study(m), "common")]


def test_studies_import_only_themselves_and_the_shared_helpers():
    """Each experiments/<study>/ imports its own modules and experiments.common, never another
    study; experiments.common imports no study (lazy imports count)."""
    modules = _all_modules()
    graph = {m: _targets(m, p, modules) for m, p in modules.items() if _study(m)}
    assert not _cross_study(graph), "\n".join(_cross_study(graph))


def test_the_study_rule_finds_a_cross_study_import():
    graph = {"experiments.a.x": {"experiments.b.y", "experiments.a.z", "experiments.common.m"},
             "experiments.common.m": {"experiments.a.x"}, "experiments.a.z": {"jaxsal"}}
    assert _cross_study(graph) == ["experiments.a.x imports experiments.b.y",
                                   "experiments.common.m imports experiments.a.x"]


def test_every_experiments_import_names_a_module_of_experiments():
    """An import of a moved study module, from experiments/ or tests/, fails here rather than when
    its function first runs."""
    modules = _all_modules()
    files = [(m, p, _package(m, p)) for m, p in modules.items() if m.startswith("experiments")]
    files += [(None, p, "tests") for p in sorted((ROOT / "tests").rglob("*.py"))]
    bad = []
    for _, p, package in files:
        for base, names, line, _ in _imports(p, package):
            if base.split(".")[0] != "experiments":
                continue
            missing = [base] if base not in modules else [
                f"{base}.{n}" for n in names or () if modules[base].name == "__init__.py" and f"{base}.{n}" not in modules]
            bad += [f"{p.relative_to(ROOT)}:{line} imports {x}" for x in missing]
    assert not bad, "\n".join(bad)


OLD_NAMES = {"jaxsal.objects": "jaxsal.game_objects", "jaxsal.io.objects": "jaxsal.io.object_files",
             "jaxsal.metrics.objects": "jaxsal.metrics.object_shares"}
"""Modules renamed by what they hold; `jaxsal.objects` is left only as a deprecated alias."""


def test_nothing_imports_the_old_objects_names():
    """Every import of the library, the agents, the experiments and the tests uses the new names
    (only the alias's own test imports `jaxsal.objects`)."""
    files = list(_all_modules().values()) + sorted((ROOT / "tests").rglob("*.py"))
    bad = [f"{p.relative_to(ROOT)}:{line} imports {t}, now {OLD_NAMES[t]}"
           for p in files if p.name != "test_public_names.py" and p != ROOT / "jaxsal" / "objects.py"
           for base, names, line, _ in _imports(p, _module_name(p).rpartition(".")[0])
           for t in [base] + [f"{base}.{n}" for n in names or ()] if t in OLD_NAMES]
    assert not bad, "\n".join(bad)


def test_the_cycle_finder_finds_a_function_local_cycle(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("import b\n")
    b.write_text("def f():\n    from a import g\n")
    modules = {"a": a, "b": b}
    graph = {m: _targets(m, p, modules) for m, p in modules.items()}
    assert _cycles(graph) == [["a", "b"]]


def _private(base: str, names) -> list[str]:
    return [p for p in base.split(".") if p.startswith("_")] + [n for n in names or () if n.startswith("_")]


def test_no_private_names_across_jaxsal_packages():
    """A `_name` (or `_module`) is imported only inside the package that defines it (its subpackages
    included: jaxsal.cli.render uses jaxsal.cli._common)."""
    bad = []
    for m, p in JAXSAL.items():
        own = _package(m, p)
        for base, names, line, _ in _imports(p, own):
            if not base.startswith("jaxsal"):
                continue
            defining = base if base in JAXSAL and JAXSAL[base].name == "__init__.py" else base.rpartition(".")[0]
            if _private(base, names) and defining != own and not own.startswith(defining + "."):
                bad.append(f"{p.relative_to(ROOT)}:{line} imports {_private(base, names)} from {base}")
    assert not bad, "\n".join(bad)


AGENT_FILES = sorted((ROOT / "agents").glob("*.py"))


def test_agents_import_each_other_relatively_and_only_public_jaxsal_names():
    """Relative imports keep agents/ working under its folder name and its installed name
    jaxsal_agents; jaxsal is used only through public names (no `_x`, not the CLI)."""
    bad = []
    for p in AGENT_FILES:
        for base, names, line, level in _imports(p, "jaxsal_agents"):
            where = f"agents/{p.name}:{line}"
            if not level and base.split(".")[0] in AGENT_NAMES:
                bad.append(f"{where}: absolute import of {base}; use a relative import (from .x import y)")
            if base.split(".")[0] == "jaxsal" and (_private(base, names) or base.startswith("jaxsal.cli")):
                bad.append(f"{where}: jaxsal internals {base} {names or ''}")
            if level and _private(base.removeprefix("jaxsal_agents"), names):
                bad.append(f"{where}: private name {_private(base, names)} from another module of agents/")
    assert not bad, "\n".join(bad)


def _code_files():
    for folder in ("jaxsal", "tests", "experiments"):
        for p in sorted((ROOT / folder).rglob("*.py")):
            if "results" not in p.relative_to(ROOT).parts:
                yield p, p.read_text()
    for p in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(p.read_text())["cells"]
        yield p, "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    for p in [ROOT / "README.md", ROOT / "Makefile", ROOT / ".ci" / "run", *sorted(ROOT.glob("agents/*.sh")),
              *sorted(ROOT.glob("experiments/**/*.sh"))]:
        yield p, p.read_text()


def test_one_name_for_the_agents_package_outside_it():
    """Outside agents/ the package is `jaxsal_agents` only, so no process holds two copies of it
    (two `Agent` classes): one run as the folder's name from a checkout, one under the installed
    name. Scripts and README commands use the installed name too."""
    pattern = re.compile(r"^\s*(import agents\b|from agents[. ]|import .*\bagents\b)|-m agents\.|\bagents\.[A-Za-z_]+\(",
                         re.M)
    bad = []
    for p, text in _code_files():
        for mt in pattern.finditer(text):
            line = text[:mt.start()].count("\n") + 1
            bad.append(f"{p.relative_to(ROOT)}:{line}: {text.splitlines()[line - 1].strip()}")
    assert not bad, "use jaxsal_agents (the installed name of agents/):\n" + "\n".join(bad)


def test_pyproject_installs_agents_as_jaxsal_agents_with_its_data_and_entry_point():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    st = cfg["tool"]["setuptools"]
    folders = {_module_name(p.parent) for p in (ROOT / "jaxsal").rglob("__init__.py")}
    assert set(st["packages"]) == folders | {"jaxsal_agents", "jaxsal_agents.shipped"}, \
        "the explicit package list must match the folders"
    assert st["package-dir"] == {"jaxsal_agents": "agents"}
    # the cards, the weights' manifest and the demo agent's weights only (tests/agents/test_weights.py); no
    # other file, whatever an old build's SOURCES.txt lists
    assert st["package-data"]["jaxsal_agents.shipped"] == ["*.json", "breakout.msgpack"]
    assert st["include-package-data"] is False
    assert "agents" not in st["packages"] and "agents" not in st["package-data"]
    assert cfg["project"]["entry-points"]["jaxsal.agents"] == {"shipped": "jaxsal_agents.provider"}
