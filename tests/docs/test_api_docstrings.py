"""The API reference a user reads: every public function of MODULES has a Google-style docstring
(a short summary, Args naming exactly its parameters with types, Returns with a type unless it
returns None, Raises naming real exception classes), parsed by griffe as the docs site parses it.
"""
from __future__ import annotations

import builtins
import importlib
import importlib.util
import inspect
import logging
import re

import pytest

from tests._support import ROOT

griffe = pytest.importorskip("griffe")
yaml = pytest.importorskip("yaml")

# Where the documented functions live: a module (its __all__, else the public functions and
# classes it defines; a class stands for its public methods) or one function by its dotted path.
MODULES = (
    "jaxsal.metrics",
    "jaxsal.loaders",
    "jaxsal.io.store",
    "jaxsal.targets",
    "jaxsal.perturbation",
    "jaxsal.load_sweep",
    "jaxsal.load_object_shares",
    "jaxsal.load_object_effects",
    "jaxsal.params_checksum",
    "jaxsal.explain",
    "jaxsal.methods",
    "jaxsal.cam_methods",
    "jaxsal.method_options",
    "jaxsal.options_table",
    "jaxsal.register",
    "jaxsal.unregister",
    "jaxsal.register_cam",
    "jaxsal.layer_calls",
    "jaxsal.with_rule",
    "jaxsal.clear_caches",
    "jaxsal.noise_tunnel",
    "jaxsal.path_integral",
    "jaxsal.gradient",
    "jaxsal.grad_x_input",
    "jaxsal.guided_backprop",
    "jaxsal.deconvnet",
    "jaxsal.smoothgrad",
    "jaxsal.integrated_gradients",
    "jaxsal.gradcam",
    "jaxsal.gradcam_pp",
    "jaxsal.g1gradcam",
    "jaxsal.g2gradcam",
    "jaxsal.guided_gradcam",
    "jaxsal.xgradcam",
)


def _site_options() -> dict:
    """mkdocs.yml's mkdocstrings options for Python: the docstring style and parser options the
    site renders with."""
    cfg = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    for plugin in cfg["plugins"]:
        if isinstance(plugin, dict) and "mkdocstrings" in plugin:
            return plugin["mkdocstrings"]["handlers"]["python"]["options"]
    raise AssertionError("mkdocs.yml has no mkdocstrings plugin")


OPTIONS = _site_options()
PARSER_OPTIONS = OPTIONS.get("docstring_options", {})
SUMMARY_LINES = 2   # the first paragraph: what the function gives, in a line or two


def _site_builder():
    """docs/_build/griffe_public.py's `_function`: a function as the site documents it (its runtime
    signature and docstring)."""
    spec = importlib.util.spec_from_file_location("griffe_public", ROOT / "docs" / "_build" / "griffe_public.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod._function


SITE_FUNCTION = _site_builder()


def _griffe_warnings(fn, doc: str) -> list[str]:
    """What griffe warns about when the site parses `fn`'s docstring (the strict build fails on
    any): parameters the signature lacks, parameters or returns without a type, ..."""
    parent = SITE_FUNCTION(fn.__name__, fn, griffe.Module("site"))
    seen: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = seen.append
    log = logging.getLogger("griffe")
    log.addHandler(handler)
    try:
        griffe.Docstring(doc, lineno=1, parent=parent, parser=OPTIONS["docstring_style"],
                         parser_options=PARSER_OPTIONS).parse()
    finally:
        log.removeHandler(handler)
    return ["griffe: " + re.sub(r"^<[^>]*>:\d+: ", "", r.getMessage()) for r in seen]


def _functions(entry: str) -> list[tuple[str, object]]:
    try:
        mod = importlib.import_module(entry)
    except ModuleNotFoundError:
        parent, name = entry.rsplit(".", 1)
        return [(entry, getattr(importlib.import_module(parent), name))]
    names = getattr(mod, "__all__", None)
    if names is None:
        names = [n for n, v in vars(mod).items() if not n.startswith("_") and (inspect.isfunction(v) or
                 inspect.isclass(v)) and v.__module__ == mod.__name__]
    out = []
    for n in names:
        v = getattr(mod, n)
        if inspect.isfunction(v):
            out.append((f"{entry}.{n}", v))
        elif inspect.isclass(v):   # a public class's public methods
            out += [(f"{entry}.{n}.{m}", f) for m, f in vars(v).items()
                    if not m.startswith("_") and inspect.isfunction(f)]
    return out


def _documented_name(p: inspect.Parameter) -> str:
    return {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "") + p.name


def _is_exception(path: str) -> bool:
    obj = getattr(builtins, path, None)
    if obj is None and "." in path:
        parent, name = path.rsplit(".", 1)
        try:
            obj = getattr(importlib.import_module(parent), name, None)
        except ImportError:
            obj = None
    return isinstance(obj, type) and issubclass(obj, BaseException)


def problems(fn) -> list[str]:
    """What is missing or wrong in `fn`'s docstring; [] for a complete one."""
    doc = inspect.getdoc(fn)
    if not doc:
        return ["no docstring"]
    out = []
    summary = doc.split("\n\n", 1)[0]
    if len(summary.splitlines()) > SUMMARY_LINES or summary.rstrip().endswith(":"):
        out.append(f"the summary is not one or two lines of text: {summary[:80]!r}")
    sections = {}
    parsed = griffe.Docstring(doc, lineno=1, parser=OPTIONS["docstring_style"], parser_options=PARSER_OPTIONS)
    for s in parsed.parse():
        sections.setdefault(s.kind.value, []).extend(s.value if isinstance(s.value, list) else [s.value])
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    if params and params[0].name in ("self", "cls"):  # a method's own first parameter, not a function's `cls=`
        params = params[1:]
    wanted = [_documented_name(p) for p in params]
    documented = [p.name for p in sections.get("parameters", [])]
    if wanted and "parameters" not in sections:
        out.append("no Args section")
    for name in wanted:
        if name not in documented:
            out.append(f"parameter {name} is not documented")
    for p in sections.get("parameters", []):
        if p.name not in wanted:
            out.append(f"documents {p.name}, which the signature lacks")
        elif not p.annotation:
            out.append(f"parameter {p.name} has no type")
        if not p.description.strip():
            out.append(f"parameter {p.name} has no description")
    if len(set(documented)) != len(documented):
        out.append(f"a parameter is documented twice: {documented}")
    returns_none = sig.return_annotation in (None, "None")
    if not returns_none and "returns" not in sections:
        out.append("no Returns section")
    if returns_none and "returns" in sections:
        out.append("a Returns section, but it returns None")
    for r in sections.get("returns", []):
        if not r.annotation or not r.description.strip():
            out.append(f"a Returns entry without a type or description: {r.description[:60]!r}")
    for r in sections.get("raises", []):
        if not _is_exception(str(r.annotation)):
            out.append(f"Raises names {r.annotation}, which is no exception class")
    return out + _griffe_warnings(fn, doc)


FUNCTIONS = [f for entry in MODULES for f in _functions(entry)]


def test_every_module_has_functions():
    for entry in MODULES:
        assert _functions(entry), f"{entry} holds no public function"


DIRECTIVE = re.compile(r"^::: (\S+)\n((?:[ \t]+\S.*\n|[ \t]*\n)*)", re.M)


def rendered(text: str) -> list[tuple[str, object]]:
    """(name, function) of each function an API page's `::: IDENT` blocks render: the listed `members`,
    else a module's __all__ or the functions and classes it defines (a class: its public methods)."""
    out = []
    for ident, options in DIRECTIVE.findall(text):
        members = re.findall(r"^[ \t]+- (\w+)[ \t]*$", options.split("members:", 1)[1], re.M) \
            if "members:" in options else None
        for entry in [f"{ident}.{m}" for m in members] if members else [ident]:
            out += [(name, fn) for name, fn in _functions(entry) if inspect.isfunction(fn)]  # not a class
    return out


def test_every_function_the_api_pages_render_is_checked():
    checked = {id(fn) for _, fn in FUNCTIONS}
    pages = sorted((ROOT / "docs" / "api").glob("*.md"))
    missing = [f"{page.name}: {name}" for page in pages for name, fn in rendered(page.read_text())
               if id(fn) not in checked]
    assert not missing, f"add them to MODULES: {missing}"


def test_rendered_reads_members_and_whole_modules():
    text = "# x\n\n::: jaxsal\n    options:\n      members:\n        - explain\n        - methods\n\n" \
           "::: jaxsal.targets\n    options:\n      show_root_heading: false\n\n::: jaxsal.gradcam\n"
    names = [n for n, _ in rendered(text)]
    assert names[:2] == ["jaxsal.explain", "jaxsal.methods"] and names[-1] == "jaxsal.gradcam"
    assert "jaxsal.targets.greedy" in names and "jaxsal.targets.q_of" in names


@pytest.mark.parametrize("name,fn", FUNCTIONS, ids=[n for n, _ in FUNCTIONS])
def test_docstring_complete(name, fn):
    assert problems(fn) == [], f"{name}: {problems(fn)}"


def _good(apply_fn, params, n: int = 3, *rest, key=None, **options) -> int:
    """A stand-in with a complete docstring.

    Args:
        apply_fn (Callable): the model.
        params (PyTree): its parameters.
        n (int): how many. Defaults to 3.
        *rest (Any): more positional inputs.
        key (jax.Array | None): a PRNG key.
        **options (Any): further options.

    Returns:
        int: the count.

    Raises:
        jaxsal.SaliencyInputError: when `n` is negative.
    """


def _with(doc: str):
    def f(apply_fn, params, n: int = 3, *rest, key=None, **options) -> int:
        pass
    f.__doc__ = doc
    return f


def test_checker_passes_a_complete_docstring():
    assert problems(_good) == []


@pytest.mark.parametrize("edit,expected", [
    (lambda d: d.replace("    n (int): how many. Defaults to 3.\n", ""), "parameter n is not documented"),
    (lambda d: d.replace("    **options (Any): further options.\n", ""), "parameter **options is not documented"),
    (lambda d: d.replace("key (jax.Array | None)", "seed (int)"), "documents seed, which the signature lacks"),
    (lambda d: d.replace("n (int):", "n:"), "parameter n has no type"),
    (lambda d: d[:d.index("Returns:")] + d[d.index("Raises:"):], "no Returns section"),
    (lambda d: d.replace("int: the count", "the count"), "a Returns entry without a type"),
    (lambda d: d.replace("jaxsal.SaliencyInputError:", "jaxsal.NoSuchError:"), "no exception class"),
    (lambda d: d.replace("    *rest (Any):", "    *rest:"), "griffe: No type or annotation for parameter '*rest'"),
    (lambda d: d.replace("A stand-in with a complete docstring.",
                         "A stand-in\nwhose summary\nruns on and on."), "the summary is not one or two lines"),
])
def test_checker_catches(edit, expected):
    doc = edit(inspect.getdoc(_good))
    assert doc != inspect.getdoc(_good)
    found = problems(_with(doc))
    assert any(expected in p for p in found), found
