"""Sweeps: every agent x checkpoint x input x method of a TOML config as one resumable explain job
each, and one tidy table of their statistics and metrics.

    jaxsal sweep sweep.toml --out runs/sweep/
    table = jaxsal.load_sweep("runs/sweep/")        # {"agent": array([...]), "insertion_auc": ...}

The config names the axes (paths are relative to the config file's folder):

    agents = ["breakout", "runs/pong/*.msgpack"]    # any --agent SPEC; a glob: its checkpoints, step_2 before step_10
    inputs = ["buffer.npy", { play = 500, seed = 1 }]
    metrics = ["insertion", "deletion"]             # also "sanity"; "objects", "effects": inputs with boxes
    [methods]
    gradcam = { layer = "conv3" }
    occlusion = { patch = 6 }

Here are the pure parts: reading and checking the config (every mistake is one
SweepConfigError naming the key and the fix, before anything is written), the plan of cells
and their stable directory names, the per-cell map statistics and metrics, and the table.
The command itself is `jaxsal.cli.sweep`; loading agents, playing and running the cells (workers, Ray) is
`jaxsal.cli.sweep_run`.
"""
from __future__ import annotations

import csv
import dataclasses
import difflib
import glob
import io
import json
import math
import os
import re
import warnings
from pathlib import Path

import numpy as np

from jaxsal.errors import SaliencyInputError, brief

CONFIG_TOML, CONFIG_JSON, RESULTS, CELLS = "sweep.toml", "sweep.json", "results.csv", "cells"
CELL_RECORD, JOB = "cell.json", "job"
TOP_KEYS = ("agents", "inputs", "methods", "metrics", "target", "seed", "chunk", "batch_size", "sanity_frames",
            "sanity_draws", "precision")
MAX_SANITY_DRAWS = 100
METRICS = ("insertion", "deletion", "objects", "effects", "sanity")
DEFAULTS = {"target": "q_chosen", "seed": 0, "chunk": 512, "batch_size": 256, "sanity_frames": 16,
            "sanity_draws": 1, "precision": "float32"}
AGENT_KEYS, INPUT_KEYS = ("spec", "card", "checkpoints", "name"), ("path", "limit", "play", "seed", "game")
BASE_COLUMNS = ("agent", "checkpoint", "input", "method", "method_name", "options", "agent_spec", "model",
                "input_spec", "target", "seed", "frames", "seconds", "status", "error")
STAT_COLUMNS = ("map_mass", "map_positive_share", "map_entropy", "newest_share", "age_centroid")
STRING_COLUMNS = ("agent", "checkpoint", "input", "method", "method_name", "options", "agent_spec", "model",
                  "input_spec", "target", "status", "error")
GLOB_CHARS = re.compile(r"[*?\[]")


class SweepConfigError(SaliencyInputError):
    """A sweep config that cannot run as written (one line: the key and the fix)."""


@dataclasses.dataclass(frozen=True)
class Cell:
    """One agent checkpoint x input x method: an ordinary explain job in `path` (under DIR)."""
    agent: str
    checkpoint: str
    input: str
    method: str
    method_name: str
    options: dict
    spec: str
    model: str | None
    input_spec: dict
    game: str | None = None

    @property
    def path(self) -> str:
        return "/".join((CELLS, self.agent, self.checkpoint, self.input, self.method))

    @property
    def input_dir(self) -> str:
        """Where a played input is saved, shared by the cell's methods."""
        return "/".join((CELLS, self.agent, self.checkpoint, self.input))

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------- the config
def read_config(path) -> dict:
    """The parsed TOML of `path` (tomllib); a missing or malformed file is a SweepConfigError."""
    import tomllib

    p = Path(path)
    try:
        return tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise SweepConfigError(f"sweep config {p} does not exist; give the path of a .toml file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise SweepConfigError(f"{p.name} is not valid TOML: {str(e).splitlines()[0]}") from None
    except OSError as e:
        raise SweepConfigError(f"cannot read sweep config {p} ({e.strerror or e}); give the path of a .toml file") \
            from None


def _hint(key: str, known) -> str:
    close = difflib.get_close_matches(key, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _slug(text: str) -> str:
    """A readable directory name: letters, digits, '.', '_' and '-' only."""
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")
    return s or "x"


def _list(raw: dict, key: str, where: str) -> list:
    v = raw.get(key)
    if v is None:
        raise SweepConfigError(f"{where}: no {key!r}; add e.g. {EXAMPLES[key]}")
    if isinstance(v, (str, dict)):
        v = [v]
    if not isinstance(v, list) or not v:
        raise SweepConfigError(f"{where}: {key!r} must be a non-empty list, e.g. {EXAMPLES[key]}")
    return v


EXAMPLES = {"agents": 'agents = ["breakout", "runs/pong/*.msgpack"]',
            "inputs": 'inputs = ["buffer.npy", { play = 500, seed = 1 }]',
            "methods": '[methods] gradcam = { layer = "conv3" }',
            "metrics": 'metrics = ["insertion", "deletion"]'}


def check_agent_spec(spec: str, model: str | None, where: str) -> str | None:
    """What `jaxsal explain --agent` would refuse, checked without loading the agent; returns
    the agent's game where its card says it (else None)."""
    from jaxsal.agent_spec import is_function_spec
    from jaxsal.loaders import FILE_SUFFIXES

    if model is not None and not Path(model).exists():
        raise SweepConfigError(f"{where}: checkpoint {model} does not exist")
    if is_function_spec(spec):
        head = spec.rpartition(":")[0]
        if head.endswith(".py") and not Path(head).exists():
            raise SweepConfigError(f"{where}: no file {head} for agent {spec!r}; check the path (relative to "
                                   "the config's folder)")
        from jaxsal.agent_spec import load_function_spec

        try:  # imported and called now: a missing FUNCTION or a load() that raises stops the sweep before any cell
            load_function_spec(spec)
        except SaliencyInputError as e:
            raise SweepConfigError(f"{where}: {e}") from None
        return None
    if Path(spec).suffix in FILE_SUFFIXES:
        if not Path(spec).exists():
            raise SweepConfigError(f"{where}: checkpoint {spec} does not exist; check the path")
        return None
    card = None
    if spec.endswith(".msgpack"):
        card = Path(spec).with_suffix(".json")
        if not Path(spec).exists():
            raise SweepConfigError(f"{where}: {spec} does not exist; check the path")
        if not card.exists():
            raise SweepConfigError(f"{where}: no agent card {card.name} beside {spec}; use "
                                   "{ card = \"CARD.json\", checkpoints = \"DIR/*.msgpack\" }")
    elif spec.endswith(".json"):
        card = Path(spec)
        if not card.exists():
            raise SweepConfigError(f"{where}: agent card {spec} does not exist; check the path")
    if card is not None:
        try:
            game = json.loads(card.read_text()).get("game")
        except (OSError, ValueError, AttributeError):
            raise SweepConfigError(f"{where}: agent card {card} is not a JSON object") from None
        if game is not None and not (isinstance(game, str) and game):  # else every cell fails, or the table check
            raise SweepConfigError(f"{where}: agent card {card}: game is {json.dumps(game)[:80]}; it must be a game "
                                   'name, e.g. "breakout"')
        return game
    from jaxsal.plugins import agent_provider

    provider = agent_provider()
    if spec not in provider.available():
        raise SweepConfigError(f"{where}: unknown agent {spec!r}{_hint(spec, provider.available())}; give a "
                               f"shipped name ({', '.join(provider.available())}), a card .json, a checkpoint, "
                               "a glob of checkpoints or path/to/file.py:FUNCTION")
    if not provider.installed(spec):
        raise SweepConfigError(f"{where}: the weights of agent {spec!r} are not installed; fetch them: "
                               f"jaxsal agents fetch {spec} --from DIR_OR_URL")
    return provider.card(spec).get("game")


def _resolve(text: str, base: Path) -> str:
    """A path of the config relative to its folder (shipped names and module specs stay)."""
    from jaxsal.agent_spec import is_function_spec

    if is_function_spec(text):
        head, _, fn = text.rpartition(":")
        return f"{base / head}:{fn}" if head.endswith(".py") and not Path(head).is_absolute() else text
    p = Path(text)
    if p.is_absolute() or GLOB_CHARS.search(text) or p.suffix or "/" in text:
        return str(p if p.is_absolute() else base / p)
    return text  # a shipped name


def natural_key(path) -> tuple:
    """Sort key of a path in natural order: each part's runs of digits compare as integers (step_2
    before step_10, ckpt_9.msgpack before ckpt_10.msgpack), then the text itself (step_02 before step_2)."""
    parts = Path(path).parts
    return tuple(tuple(int(t) if i % 2 else t for i, t in enumerate(re.split(r"(\d+)", p))) for p in parts), \
        str(path)


def _expand(pattern: str, base: Path, where: str) -> list[Path]:
    """The files a glob matches, in natural order (the checkpoints' order down the table)."""
    matches = sorted((Path(m) for m in glob.glob(_resolve(pattern, base), recursive=True) if Path(m).is_file()),
                     key=natural_key)
    if not matches:
        raise SweepConfigError(f"{where}: no file matches {pattern!r} (relative to {base}); check the pattern "
                               "or train the checkpoints first")
    return matches


def _glob_root(pattern: str, base: Path) -> Path:
    """The folder above the first glob character of a pattern: the checkpoints' agent."""
    parts = Path(_resolve(pattern, base)).parts
    i = next(k for k, part in enumerate(parts) if GLOB_CHARS.search(part))
    return Path(*parts[:i]) if i else Path(".")


def _ckpt_label(match: Path, root: Path) -> str:
    rel = match.relative_to(root) if match.is_relative_to(root) else Path(match.name)
    return _slug(str(rel.with_suffix("")).replace(os.sep, "-"))


def plan_agents(raw: dict, base: Path) -> list[tuple[str, str, str, str | None, str | None]]:
    """[(agent, checkpoint, spec, model, game), ...] from `agents`, the checkpoints of a glob in natural
    order (`natural_key`), those of a list as listed."""
    out = []
    for k, entry in enumerate(_list(raw, "agents", "agents")):
        where = f"agents[{k}]"
        if isinstance(entry, str):
            entry = {"spec": entry}
        if not isinstance(entry, dict):
            raise SweepConfigError(f"{where}: give an agent SPEC string or a table such as "
                                   '{ card = "CARD.json", checkpoints = "DIR/*.msgpack" }')
        bad = [key for key in entry if key not in AGENT_KEYS]
        if bad:
            raise SweepConfigError(f"{where}: unknown key {bad[0]!r}{_hint(bad[0], AGENT_KEYS)}; an agent table "
                                   f"takes {', '.join(AGENT_KEYS)}")
        if ("spec" in entry) == ("card" in entry):
            raise SweepConfigError(f"{where}: give exactly one of spec = \"SPEC\" or card = \"CARD.json\" "
                                   "(with checkpoints = \"DIR/*.msgpack\")")
        name = entry.get("name")
        if name is not None and (not isinstance(name, str) or not name):
            raise SweepConfigError(f"{where}: name must be a non-empty string")
        if "spec" in entry:
            spec = entry["spec"]
            if not isinstance(spec, str) or not spec:
                raise SweepConfigError(f"{where}: spec must be an agent SPEC string, e.g. \"breakout\"")
            if GLOB_CHARS.search(spec):
                root = _glob_root(spec, base)
                label = _slug(name or root.name)
                for m in _expand(spec, base, where):
                    game = check_agent_spec(str(m), None, where)
                    out.append((label, _ckpt_label(m, root), str(m), None, game))
            else:
                full = _resolve(spec, base)
                game = check_agent_spec(full, None, where)
                label = name or (spec.rpartition(":")[2] if ":" in spec else Path(spec).stem if Path(spec).suffix
                                 else Path(spec).name)
                out.append((_slug(label), "default", full, None, game))
        else:
            card = _resolve(entry["card"], base) if isinstance(entry["card"], str) else None
            if card is None or not Path(card).exists():
                raise SweepConfigError(f"{where}: card {entry['card']!r} does not exist; give the agent card "
                                       ".json of the checkpoints")
            game = check_agent_spec(card, None, where)
            ckpts = entry.get("checkpoints")
            if isinstance(ckpts, str):
                root = _glob_root(ckpts, base) if GLOB_CHARS.search(ckpts) else Path(_resolve(ckpts, base)).parent
                matches = _expand(ckpts, base, where) if GLOB_CHARS.search(ckpts) else [Path(_resolve(ckpts, base))]
            elif isinstance(ckpts, list) and ckpts and all(isinstance(c, str) for c in ckpts):
                matches = [Path(_resolve(c, base)) for c in ckpts]
                root = Path(os.path.commonpath([str(m.parent) for m in matches]))
            else:
                raise SweepConfigError(f"{where}: checkpoints must be a glob or a list of .msgpack files, e.g. "
                                       "checkpoints = \"runs/pong/*.msgpack\"")
            label = _slug(name or Path(card).stem)
            for m in matches:
                check_agent_spec(card, str(m), where)
                out.append((label, _ckpt_label(m, root), card, str(m), game))
    seen = {}
    for a, c, spec, model, _ in out:
        if (a, c) in seen:
            raise SweepConfigError(f"agents: {seen[(a, c)]} and {model or spec} are both agent {a!r} checkpoint "
                                   f"{c!r}; give one a name: {{ spec = \"...\", name = \"other\" }}")
        seen[(a, c)] = model or spec
    return out


def plan_inputs(raw: dict, base: Path) -> list[tuple[str, dict]]:
    """[(label, input), ...]: {"path": absolute, ["limit"]} or {"play": steps, "seed", ["game"]}."""
    out = []
    for k, entry in enumerate(_list(raw, "inputs", "inputs")):
        where = f"inputs[{k}]"
        if isinstance(entry, str):
            entry = {"path": entry}
        if not isinstance(entry, dict):
            raise SweepConfigError(f"{where}: give a path or a table {{ play = 500, seed = 1 }}")
        bad = [key for key in entry if key not in INPUT_KEYS]
        if bad:
            raise SweepConfigError(f"{where}: unknown key {bad[0]!r}{_hint(bad[0], INPUT_KEYS)}; an input takes "
                                   "path (and limit) or play (and seed, game)")
        if ("path" in entry) == ("play" in entry):
            raise SweepConfigError(f"{where}: give exactly one of path = \"buffer.npy\" or play = STEPS")
        for key in ("limit", "play", "seed"):
            v = entry.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < (0 if key == "seed" else 1)):
                raise SweepConfigError(f"{where}: {key} must be a {'non-negative' if key == 'seed' else 'positive'} "
                                       f"integer, got {v!r}")
        if "path" in entry:
            if {"seed", "game"} & set(entry):
                raise SweepConfigError(f"{where}: seed and game are for play inputs; a path input takes limit")
            path = Path(_resolve(str(entry["path"]), base))
            if not path.exists():
                raise SweepConfigError(f"{where}: no file or folder {entry['path']!r} (relative to {base}); check "
                                       "the path")
            spec = {"path": str(path), **({"limit": entry["limit"]} if "limit" in entry else {})}
            stem = path.name[:-len(path.suffix)] if path.suffix in (".npy", ".npz") else path.name
            label = _slug(stem + (f"-first{entry['limit']}" if "limit" in entry else ""))
        else:
            if "limit" in entry:
                raise SweepConfigError(f"{where}: limit is for path inputs; play = STEPS plays that many steps")
            if "game" in entry and not (isinstance(entry["game"], str) and entry["game"]):  # else str()'d per cell
                raise SweepConfigError(f"{where}: game is {entry['game']!r}; it must be a game name, e.g. "
                                       'game = "breakout"')
            spec = {"play": entry["play"], "seed": entry.get("seed", 0),
                    **({"game": str(entry["game"])} if "game" in entry else {})}
            label = _slug(f"play{spec['play']}-seed{spec['seed']}" + (f"-{spec['game']}" if "game" in spec else ""))
        if any(label == o[0] for o in out):
            raise SweepConfigError(f"{where}: a second input named {label!r}; the inputs must differ")
        out.append((label, spec))
    return out


def _toml_time(v):
    """The first TOML date, time or datetime in an option value (lists and tables searched), else None."""
    import datetime

    if isinstance(v, (datetime.date, datetime.time)):  # datetime.datetime is a date
        return v
    items = v.values() if isinstance(v, dict) else v if isinstance(v, list) else ()
    return next((t for t in map(_toml_time, items) if t is not None), None)


def plan_methods(raw: dict):
    """[MethodSpec, ...] from the [methods] table (a table's `method` names the method of an alias: a
    registered name or an expression, jaxsal.engine.expression); unknown methods, bad expressions and
    unknown options are refused as `jaxsal explain` refuses them."""
    import jaxsal  # noqa: F401  (registers the methods)
    from jaxsal.engine import expression
    from jaxsal.io.job import MethodSpec, check_specs
    from jaxsal.registry import METHODS, accepted_options, check_options

    table = raw.get("methods")
    if not isinstance(table, dict) or not table:
        raise SweepConfigError(f"no [methods] table; add e.g. {EXAMPLES['methods']}")
    specs = []
    for alias, opts in table.items():
        where = f"[methods] {alias}"
        if not isinstance(opts, dict):
            raise SweepConfigError(f"{where}: give a table of options, e.g. {alias} = {{}} for the defaults")
        opts = dict(opts)
        for key, v in opts.items():  # a TOML date or time is no option value (and no JSON for the cell's record)
            bad = _toml_time(v)
            if bad is not None:
                raise SweepConfigError(f"{where}: {key} is the TOML {type(bad).__name__} {bad.isoformat()}; give a "
                                       f"number, a string or a list of them (as text, quote it: \"{bad.isoformat()}\")")
        named = "method" in opts
        try:
            method = expression.canonical(opts.pop("method", alias))
            accepted = accepted_options(expression.function(method))
        except SaliencyInputError as e:
            hint = "" if named else ' (or set method = "NAME" for an alias)'
            raise SweepConfigError(f"{where}: {e}{hint}") from None
        alias = alias if named else expression.alias(method)
        try:
            check_options(method, accepted, opts, shown=[a for a in accepted if a not in ("key", "batch_size", "actions")])
        except SaliencyInputError as e:
            hint = f" (jaxsal.method_options({method!r}))" if method in METHODS else ""
            raise SweepConfigError(f"{where}: {e}{hint}") from None
        specs.append(MethodSpec(alias, method, opts))
    try:
        check_specs(specs)
    except SaliencyInputError as e:
        raise SweepConfigError(f"[methods]: {e}") from None
    return specs


def plan_metrics(raw: dict) -> list[str]:
    v = raw.get("metrics", [])
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(m, str) for m in v):
        raise SweepConfigError(f"metrics must be a list of names, e.g. {EXAMPLES['metrics']}")
    for m in v:
        if m not in METRICS:
            raise SweepConfigError(f"metrics: unknown metric {m!r}{_hint(m, METRICS)}; use any of "
                                   f"{', '.join(METRICS)} (map statistics are always computed)")
    if len(set(v)) != len(v):
        raise SweepConfigError("metrics: a metric is named twice; name each once")
    return list(v)


def settings(raw: dict) -> dict:
    """The job settings of the top level, with their defaults."""
    out = dict(DEFAULTS)
    for key in DEFAULTS:
        if key not in raw:
            continue
        v = raw[key]
        if key == "target":
            from jaxsal.targets import TARGET_NAMES

            if v not in TARGET_NAMES:
                raise SweepConfigError(f"target: unknown target {v!r}; use one of {', '.join(TARGET_NAMES)}")
        elif key == "precision":
            from jaxsal.engine.precision import PRECISIONS

            if v not in PRECISIONS:
                raise SweepConfigError(f"precision: unknown precision {v!r}; use one of {', '.join(PRECISIONS)}")
        elif isinstance(v, bool) or not isinstance(v, int) or v < (0 if key == "seed" else 1):
            raise SweepConfigError(f"{key}: must be a {'non-negative' if key == 'seed' else 'positive'} integer, "
                                   f"got {v!r}")
        elif key == "sanity_draws" and v > MAX_SANITY_DRAWS:  # every draw's weights are held at once: 2**63-1 ran
            # each cell's job, then exhausted memory listing the draws (the process killed, the table unwritten)
            raise SweepConfigError(f"sanity_draws: must be an integer from 1 to {MAX_SANITY_DRAWS} (each draw is a "
                                   f"copy of the agent's weights, held at once), got {v!r}; 10 draws is usual")
        out[key] = v
    return out


def plan(raw: dict, base) -> tuple[list[Cell], list[str], dict]:
    """(cells in table order, metrics, settings) of a parsed config, every part checked; rows
    are agents (a glob's checkpoints in natural order) x inputs x methods in the config's order."""
    base = Path(base).absolute()
    for key in raw:
        if key not in TOP_KEYS:
            raise SweepConfigError(f"unknown top-level key {key!r}{_hint(key, TOP_KEYS)}; a sweep config takes "
                                   f"{', '.join(TOP_KEYS)}")
    specs = plan_methods(raw)
    metrics = plan_metrics(raw)
    sett = settings(raw)
    agents = plan_agents(raw, base)
    inputs = plan_inputs(raw, base)
    for m in ("objects", "effects"):
        if m in metrics:
            check_objects(agents, inputs, m)
            break
    cells = [Cell(a, c, label, s.alias, s.method, dict(s.options), spec, model, inp, game)
             for a, c, spec, model, game in agents for label, inp in inputs for s in specs]
    return cells, metrics, sett


def check_objects(agents, inputs, metric: str = "objects"):
    """The objects and effects metrics need a game with an object table and boxes for every input."""
    from jaxsal.io.object_files import RECORD_HINT, find_objects
    from jaxsal.game_objects import games

    for a, c, spec, _, game in agents:
        if game is not None and game.lower().replace("_", "").replace("-", "") not in games():
            raise SweepConfigError(f"metrics: '{metric}' needs a game with an object table, but agent {a!r} plays "
                                   f"{game!r} (games with one: {', '.join(games())}); drop '{metric}' or that agent")
    for label, inp in inputs:
        if "play" in inp:  # played on the env that records each state's boxes (jaxsal explain --play --objects)
            for a, c, spec, _, game in agents:
                g = inp.get("game") or game
                if g is None or g.lower().replace("_", "").replace("-", "") not in games():
                    raise SweepConfigError(
                        f"metrics: '{metric}' needs boxes, and input {label!r} is played by agent {a!r} in "
                        f"{repr(g) if g else 'a game it does not name'}, which has no object table (games with one: "
                        f"{', '.join(games())}); give the input a game, or record frames with their boxes: "
                        f"{RECORD_HINT}, and list DIR/obs.npy")
            continue
        try:
            found = find_objects("auto", inp["path"], None)
        except SaliencyInputError as e:
            raise SweepConfigError(f"metrics: '{metric}' for input {label!r}: {e}") from None
        _check_class_columns(found.classes, f"metrics: '{metric}' for input {label!r}: {found.path}", metric)


def _check_class_columns(classes, where: str, metric: str) -> None:
    """A class's columns are named by its _slug: two classes of one slug ('ball!', 'ball?') would write the same
    columns, one's means silently overwriting the other's."""
    seen: dict = {}
    for cls in classes:
        if _slug(cls) in seen:
            raise SweepConfigError(f"{where} has classes {seen[_slug(cls)]!r} and {cls!r}, which would both be the "
                                   f"columns {metric}_{_slug(cls)}_*; rename one in the objects file (letters, digits, "
                                   "'.', '_' and '-' are kept in column names)")
        seen[_slug(cls)] = cls


def stored_config(raw: dict, base) -> dict:
    """What identifies a sweep in its DIR (compared on rerun): the parsed config and its folder."""
    return json.loads(json.dumps({"config": raw, "config_dir": str(Path(base).absolute())}, sort_keys=True,
                                 default=str))


def check_dir(out, stored: dict, config_name: str):
    """A sweep's DIR is new, empty, or holds this same config (a rerun resumes); otherwise refused."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise SweepConfigError(f"--out {out} exists and is not a directory; choose another --out")
    if not out.exists() or not any(out.iterdir()):
        return
    try:
        old = json.loads((out / CONFIG_JSON).read_text())
    except FileNotFoundError:
        raise SweepConfigError(f"--out {out} is not empty and holds no sweep ({CONFIG_JSON}); choose another --out")
    except (OSError, ValueError) as e:
        old = brief(e)
    if not (isinstance(old, dict) and isinstance(old.get("config"), dict)):  # edited or damaged: not resumable
        why = old if isinstance(old, str) else "not the config and folder `jaxsal sweep` writes"
        raise SweepConfigError(f"{out / CONFIG_JSON} is corrupt ({why}), so which sweep {out} holds is unknown; "
                               "choose another --out")
    if old.get("config") == stored["config"] and old.get("config_dir") != stored["config_dir"]:
        raise SweepConfigError(f"{out} holds this sweep run from the config in {old.get('config_dir')} (its paths are "
                               "relative to that folder): run that file, or choose another --out")
    if old.get("config") != stored["config"]:
        keys = sorted(k for k in set(old.get("config", {})) | set(stored["config"])
                      if old.get("config", {}).get(k) != stored["config"].get(k))
        raise SweepConfigError(f"{out} holds a sweep of another config ({out / CONFIG_TOML}; {', '.join(keys)} "
                               f"{'differs' if len(keys) == 1 else 'differ'} in {config_name}): rerun with that "
                               "config, or choose another --out")


# --------------------------------------------------------------------------- per cell
def map_statistics(maps, num_frames: int | None = None) -> dict:
    """Per-frame statistics of maps (n, H, W) or per-frame (n, H, W, C): absolute mass, the share of
    it that is positive, the normalised entropy of |map| over pixels (1 = uniform, 0 = one
    pixel; NaN for an all-zero map) and, for per-frame maps of `num_frames` stacked frames, the
    newest frame's share and the mean age of the attended frames (jaxsal.metrics.frames)."""
    from jaxsal.metrics.frames import age_centroid, frame_shares, newest_share

    m = np.asarray(maps, np.float64)
    n = m.shape[0]
    flat = np.abs(m.sum(-1) if m.ndim == 4 else m).reshape(n, -1)
    mass = np.abs(m).reshape(n, -1).sum(1)
    pos = np.maximum(m, 0).reshape(n, -1).sum(1)
    tot = flat.sum(1, keepdims=True)
    p = np.divide(flat, tot, out=np.zeros_like(flat), where=tot > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ent = -np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0).sum(1) / math.log(flat.shape[1])
    out = {"map_mass": mass, "map_positive_share": np.where(mass > 0, pos / np.where(mass > 0, mass, 1), np.nan),
           "map_entropy": np.where(tot[:, 0] > 0, ent, np.nan)}
    if m.ndim == 4:
        shares = frame_shares(m, num_frames or m.shape[-1])
        out.update(newest_share=newest_share(shares), age_centroid=age_centroid(shares))
    else:
        out.update(newest_share=np.full(n, np.nan), age_centroid=np.full(n, np.nan))
    return out


def _mean(v) -> float:
    v = np.asarray(v, np.float64)
    return float(np.nanmean(v)) if np.isfinite(v).any() else float("nan")


def sanity_layers(params) -> list[str]:
    """The layers a sanity cascade randomises, top-down: the usual DQN names where the params
    have them, else every top-level module (not the norms) from the last to the first."""
    from jaxsal.metrics.sanity import DEFAULT_LAYERS, NORM_SUFFIX

    top = params.get("params", params) if isinstance(params, dict) else {}
    names = [k for k in top if not str(k).endswith(NORM_SUFFIX)]
    known = [n for n in DEFAULT_LAYERS if n in names]
    return known or list(reversed(names))


def cell_metrics(apply_fn, params, source, job_dir, cell: Cell, metrics, sett: dict, *, layout: str = "NHWC",
                 init_fn=None, num_frames: int | None = None) -> dict:
    """{column: value} of one finished cell: the map statistics and each metric, means over its
    frames (read chunk by chunk from the job in `job_dir` and from `source`, the frames explained).
    Insertion/deletion follow the sweep's target (q_action: the source's actions) with the score
    jaxsal.metrics picks for it; `{name}_auc` is the mean over the frames whose score is defined,
    `{name}_defined` their share (NaN AUC where none is)."""
    import jax

    from jaxsal.io.store import load_maps
    from jaxsal.metrics import deletion, insertion

    maps = load_maps(job_dir, cell.method)
    n, chunk = len(source), sett["chunk"]
    per: dict = {}
    for a in range(0, n, chunk):
        b = min(n, a + chunk)
        m = np.asarray(maps[a:b], np.float32)
        for k, v in map_statistics(m, num_frames).items():
            per.setdefault(k, []).append(v)
        if {"insertion", "deletion"} & set(metrics):
            x = np.asarray(source.read(a, b))
            flat = m.sum(-1) if m.ndim == 4 else m
            acts = np.asarray(source.actions(a, b)) if sett["target"] == "q_action" else None
            for name, fn in (("insertion", insertion), ("deletion", deletion)):
                if name in metrics:
                    with warnings.catch_warnings():  # undefined states: NaN, counted in {name}_defined
                        warnings.simplefilter("ignore", RuntimeWarning)
                        auc = np.asarray(fn(apply_fn, params, x, flat, target=sett["target"], actions=acts,
                                            layout=layout, batch_size=sett["batch_size"])["auc"])
                    per.setdefault(f"{name}_auc", []).append(auc)
                    per.setdefault(f"{name}_defined", []).append(np.isfinite(auc).astype(np.float64))
    out = {k: _mean(np.concatenate(v)) for k, v in per.items()}
    if "objects" in metrics:
        from jaxsal.io.object_files import load_object_shares, mean_shares

        for cls, row in sorted(mean_shares(load_object_shares(job_dir, cell.method)).items()):
            for k in ("positive", "absolute", "chance", "pointing"):
                out[f"objects_{_slug(cls)}_{k}"] = row[k]
    if "effects" in metrics:
        out.update(effect_columns(job_dir, cell.method))
    if "sanity" in metrics:
        from jaxsal.metrics import sanity_check

        if init_fn is None:
            raise SweepConfigError("the sanity metric needs the agent's initialiser (a flax module); this agent "
                                   "gives only apply_fn: drop 'sanity' for it")
        k = min(n, sett["sanity_frames"])
        x = np.asarray(source.read(0, k))
        opts = {key: v for key, v in cell.options.items() if key not in ("target", "per_frame")}  # on 2-D maps
        res = sanity_check(init_fn, params, x, method=cell.method_name, layers=sanity_layers(params),
                           key=jax.random.PRNGKey(sett["seed"]), apply_fn=apply_fn, layout=layout,
                           target=sett["target"], draws=range(sett.get("sanity_draws", 1)), **opts)
        for layer in res[0]:   # means over the frames of every draw
            for metric in sorted(res[0][layer]):
                out[f"sanity_{layer}_{metric}"] = _mean(np.concatenate([np.asarray(r[layer][metric]) for r in res.values()]))
    return out


def effect_columns(job_dir, method: str) -> dict:
    """The effects metric of one finished cell: per object class, the mean drop of the explained
    output when the class is removed and how often the greedy action flips (over the frames that
    show it), and how well the method's positive object shares rank the classes as their removal
    does (`jaxsal.metrics.effect_agreement`: within-state rank correlation, and per class across
    states). Point estimates only: a sweep input has no episode ids to resample."""
    import warnings

    from jaxsal.io.object_files import load_object_effects, load_object_shares
    from jaxsal.metrics import effect_agreement

    e = load_object_effects(job_dir)
    sh = load_object_shares(job_dir, method)
    present = e["present"] & sh["present"]
    out = {}
    for j, cls in enumerate(e["classes"]):
        p = present[:, j]
        out[f"effects_{_slug(cls)}_effect"] = _mean(e["effect"][p, j]) if p.any() else float("nan")
        out[f"effects_{_slug(cls)}_flips"] = _mean(e["flips"][p, j].astype(np.float64)) if p.any() else float("nan")
    keep = present & ~(e.get("overlap", np.zeros_like(e["effect"])) >= 1)     # a class never removed says nothing
    shares = np.where(keep, sh["positive"], np.nan)
    effects = np.where(keep, e["effect"], np.nan)
    with warnings.catch_warnings():      # constant shares or effects: NaN correlations, counted in the states
        warnings.simplefilter("ignore", RuntimeWarning)
        agr = effect_agreement(shares, effects, n_resamples=1)
    out["effects_agreement_within_state"] = agr["within_state"]["mean"]
    out["effects_agreement_states"] = agr["within_state"]["states"]
    for cls, r in agr["across_states"].items():
        out[f"effects_{_slug(cls)}_agreement"] = r["rho"]
    return out


def write_record(path, record: dict):
    """A cell's own summary (status, frames, seconds, metrics), atomically: a cell is done when it exists."""
    from jaxsal.io.store import atomic_write

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    atomic_write(Path(path), json.dumps(record, indent=2, sort_keys=True, allow_nan=True).encode())


def read_record(out, cell: Cell) -> dict | None:
    """A cell's record, or None (not run, or a record damaged or edited into another shape: the cell runs
    again, its job resuming from its finished chunks)."""
    try:
        rec = json.loads((Path(out) / cell.path / CELL_RECORD).read_text())
    except (OSError, ValueError):
        return None
    if not (isinstance(rec, dict) and isinstance(rec.get("status"), str)
            and isinstance(rec.get("metrics") or {}, dict)):
        return None
    return rec


# --------------------------------------------------------------------------- the table
def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return "nan" if math.isnan(v) else format(v, ".10g")
    return str(v)


def _display(path: str | None, base: Path) -> str:
    if not path:
        return ""
    p = Path(path.rpartition(":")[0] if ":" in path and not Path(path).exists() else path)
    tail = path[len(str(p)):]
    try:
        return str(p.relative_to(base)) + tail
    except ValueError:
        return path


def table_rows(out, cells: list[Cell], metrics: list[str], sett: dict, base) -> tuple[list[str], list[dict]]:
    """(columns, rows) of the table: one row per cell in plan order, its settings, frames,
    seconds, status and every statistic and metric ("pending" for a cell not run yet)."""
    base = Path(base).absolute()
    rows, extra = [], []
    for c in cells:
        rec = read_record(out, c) or {"status": "pending"}
        inp = {k: (_display(v, base) if k == "path" else v) for k, v in c.input_spec.items()}
        row = {"agent": c.agent, "checkpoint": c.checkpoint, "input": c.input, "method": c.method,
               "method_name": c.method_name, "options": json.dumps(c.options, sort_keys=True, separators=(",", ":")),
               "agent_spec": _display(c.spec, base), "model": _display(c.model, base),
               "input_spec": json.dumps(inp, sort_keys=True, separators=(",", ":")), "target": sett["target"],
               "seed": sett["seed"], "frames": rec.get("frames"), "seconds": rec.get("seconds"),
               "status": rec["status"], "error": rec.get("error", "")}
        for k, v in (rec.get("metrics") or {}).items():
            row[k] = v
            if k not in STAT_COLUMNS and k not in extra:
                extra.append(k)
        rows.append(row)
    order = {m: i for i, m in enumerate(["insertion", "deletion", "objects", "effects", "sanity"])}
    extra.sort(key=lambda k: (order.get(k.split("_")[0], 9), k))
    return list(BASE_COLUMNS) + list(STAT_COLUMNS) + extra, rows


def write_table(out, cells, metrics, sett, base) -> Path:
    """DIR/results.csv from the cells' records, atomically; the same records give the same bytes."""
    from jaxsal.io.store import atomic_write

    cols, rows = table_rows(out, cells, metrics, sett, base)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    for r in rows:
        w.writerow([_fmt(r.get(c)) for c in cols])
    path = Path(out) / RESULTS
    atomic_write(path, buf.getvalue().encode())
    return path


def load_sweep(out, as_frame: bool = False):
    """The table of a `jaxsal sweep` output directory (its results.csv), one row per cell
    (agent x checkpoint x input x method), as numpy columns or a pandas DataFrame.

    Args:
        out (str | os.PathLike): the sweep's output directory.
        as_frame (bool): return a pandas DataFrame (needs pandas) instead of a dict.

    Returns:
        dict[str, numpy.ndarray] | pandas.DataFrame: `{column: (rows,)}` in the file's column
            order: text columns as str arrays, the others as float64 (an empty cell is NaN),
            "frames" and "seed" as int64 when every row has them; or the same as a DataFrame.

    Raises:
        jaxsal.SaliencyInputError: `out` has no results.csv, it is corrupt, or `as_frame=True` without
            pandas.
    """
    path = Path(out) / RESULTS
    if not path.exists():
        raise SaliencyInputError(f"{out} has no {RESULTS}; run `jaxsal sweep CONFIG.toml --out {out}` first")
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
        if not rows:
            raise ValueError("empty")
        header, values = rows[0], rows[1:]
        bad = next((j for j, r in enumerate(values) if len(r) != len(header)), None)
        if bad is not None or not {"agent", "status"} <= set(header):
            raise ValueError(f"row {bad + 1} has {len(values[bad])} of {len(header)} columns" if bad is not None
                             else "no agent and status columns")
        cols = {}
        for i, name in enumerate(header):
            raw = [r[i] for r in values]
            if name in STRING_COLUMNS:
                cols[name] = np.asarray(raw, dtype=str)
            elif name in ("frames", "seed") and raw and all(v.lstrip("-").isdigit() for v in raw):
                cols[name] = np.asarray([int(v) for v in raw], np.int64)
            else:
                cols[name] = np.asarray([float(v) if v not in ("",) else np.nan for v in raw], np.float64)
    except (ValueError, IndexError, IsADirectoryError, csv.Error) as e:  # truncated, emptied, edited, not text
        raise SaliencyInputError(f"{path} is corrupt ({brief(e)}): "
                                 "delete it and rerun the same `jaxsal sweep` command, which writes it again from "
                                 "the cells' records") from None
    if as_frame:
        try:
            import pandas as pd
        except ImportError:
            raise SaliencyInputError("load_sweep(as_frame=True) needs pandas: pip install pandas, or use the "
                                     "dict of numpy columns") from None
        return pd.DataFrame(cols, columns=header)
    return cols
