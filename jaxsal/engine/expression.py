"""Method expressions: a method written as text, for `jaxsal explain --methods` and sweep configs.

    gradcam
    noise_tunnel(gradcam, n=16, variant=vargrad)       # SmoothGrad-style average of Grad-CAM
    path_integral(guided_backprop, steps=32)           # Integrated Gradients of Guided Backprop

An expression is a registered method's name or a call of a combinator (jaxsal.engine.combinators)
on an expression, with the combinator's arguments as keywords of literal value (numbers, strings,
True/False; a bare word is a string). It is read with `ast`, never evaluated. `canonical` writes
an expression one way (what a job's manifest records: keywords in the combinator's order, none at its
default value), `alias` gives it a directory name.
"""
from __future__ import annotations

import ast
import difflib
import inspect
import re

from jaxsal import registry
from jaxsal.engine.combinators import noise_tunnel, path_integral
from jaxsal.engine.execute import method_function
from jaxsal.engine.spec import Spec
from jaxsal.errors import SaliencyInputError

COMBINATORS = {"noise_tunnel": noise_tunnel, "path_integral": path_integral}
EXAMPLE = "noise_tunnel(gradcam, n=16)"
FORMS = f"a method name (gradcam) or a combinator call on one, e.g. {EXAMPLE} or path_integral(guided_backprop, steps=32)"


def keywords(combinator: str) -> tuple[str, ...]:
    """The arguments an expression gives a combinator: its arguments after the method, before '*'."""
    params = list(inspect.signature(COMBINATORS[combinator]).parameters.values())[1:]
    return tuple(p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD)


def forms() -> str:
    """'noise_tunnel(METHOD, n=, sigma=, variant=), path_integral(...)': the combinators' call forms."""
    return ", ".join(f"{c}(METHOD, {', '.join(k + '=' for k in keywords(c))})" for c in COMBINATORS)


def parse(text: str) -> str | Spec:
    """The method of an expression: a registered method's name as it is, a combinator call as its Spec
    (named by its canonical text)."""
    return _build(_read(text))


def canonical(text: str) -> str:
    """The expression written one way: keywords in the combinator's order, those at their default left
    out, bare words where they can be."""
    return _text(_read(text))


def alias(text: str) -> str:
    """A directory name of the expression (letters, digits, _ and -): noise_tunnel(gradcam, n=16)
    -> noise_tunnel-gradcam-n_16; a method's name is its own."""
    tree = _read(text)
    return tree if isinstance(tree, str) else _slug(tree)


def function(method):
    """The method function (what jaxsal.explain calls) of a name, an expression or a Spec."""
    method = parse(method) if isinstance(method, str) else method
    return method_function(method) if isinstance(method, Spec) else registry.get_method(method)


def split(text: str) -> list[str]:
    """A comma list of expressions, split at its top-level commas only (a call's, and a quoted
    string's, belong to it)."""
    parts, depth, start, quote, escaped = [], 0, 0, "", False
    for i, ch in enumerate(text):
        if quote:
            escaped, quote = (not escaped and ch == "\\"), ("" if ch == quote and not escaped else quote)
            continue
        if ch in "'\"":
            quote = ch
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return parts + [text[start:]]


# ------------------------------------------------------------------ reading
def _refuse(text: str, why: str) -> SaliencyInputError:
    if len(text) > 200:  # a crafted or pasted text of thousands of characters: its start, not all of it
        text = f"{text[:60]}... ({len(text)} characters)"
    return SaliencyInputError(f"method {text!r}: {why}; write {FORMS}")


def _read(text):
    """The expression as a tree: a method name, or (combinator, tree, ((keyword, value), ...))."""
    if not isinstance(text, str) or not text.strip():
        raise SaliencyInputError(f"a method must be a non-empty string, got {text!r}; write {FORMS}")
    text = text.strip()
    if text in registry.METHODS:  # also a plugin's name that is no Python name
        return text
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError as e:
        raise _refuse(text, f"not an expression ({e.msg})") from None
    except (RecursionError, MemoryError):  # thousands of '~' or '-' overflow Python's parser
        raise _refuse(text, "nested too deeply to read") from None
    return _tree(node, text)


def _tree(node, text):
    if isinstance(node, ast.Name) or (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        name = node.id if isinstance(node, ast.Name) else node.value
        if name in registry.METHODS:
            return name
        known = sorted(registry.METHODS)
        close = difflib.get_close_matches(name, known + list(COMBINATORS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise SaliencyInputError(f"unknown method {name!r}{hint}; available: {', '.join(known)}; or a combinator "
                                 f"call, e.g. {EXAMPLE}")
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        raise _refuse(text, f"{ast.unparse(node)!r} is neither a method name nor a combinator call")
    comb = node.func.id
    if comb not in COMBINATORS:
        raise _refuse(text, f"{comb!r} is not a combinator (combinators: {', '.join(COMBINATORS)})")
    if len(node.args) != 1 or isinstance(node.args[0], ast.Starred):
        raise _refuse(text, f"{comb} takes one method, then keywords: {forms()}")
    allowed = keywords(comb)
    given = {}
    for kw in node.keywords:
        if kw.arg not in allowed:
            raise _refuse(text, f"{comb} has no argument {kw.arg!r}; it takes {', '.join(allowed)} (a method's own "
                                "options: --option ALIAS.NAME=VALUE, or the sweep entry's table)")
        given[kw.arg] = _value(kw.value, text)
    defaults = _defaults(comb)
    return comb, _tree(node.args[0], text), tuple((k, given[k]) for k in allowed
                                                  if k in given and not _same(given[k], defaults[k]))


def _defaults(combinator: str) -> dict:
    return {p.name: p.default for p in inspect.signature(COMBINATORS[combinator]).parameters.values()}


def _same(value, default) -> bool:
    """A keyword given at its default value (so n=50 and no n are one expression); True is not 1."""
    return type(value) is type(default) and value == default


def _value(node, text):
    """A keyword's value: a number, a string, True/False, or a bare word (a string)."""
    if isinstance(node, ast.Name):
        return node.id
    try:
        v = ast.literal_eval(node)
    except ValueError:
        v = None
    if not isinstance(v, (bool, int, float, str)):
        raise _refuse(text, f"{ast.unparse(node)!r} is no number, string or True/False")
    return v


def _word(v) -> str:
    return v if isinstance(v, str) and v.isidentifier() and v not in ("True", "False", "None") else repr(v)


def _text(tree) -> str:
    if isinstance(tree, str):
        return tree
    comb, inner, kws = tree
    return f"{comb}({', '.join([_text(inner)] + [f'{k}={_word(v)}' for k, v in kws])})"


def _token(v) -> str:
    return re.sub(r"[^A-Za-z0-9_]", lambda m: {".": "p", "-": "m"}.get(m[0], "_"), str(v))


def _slug(tree) -> str:
    if isinstance(tree, str):
        return _token(tree)
    comb, inner, kws = tree
    return "-".join([comb, _slug(inner)] + [f"{k}_{_token(v)}" for k, v in kws])


def _build(tree):
    if isinstance(tree, str):
        return tree
    comb, inner, kws = tree
    inner = _build(inner)
    try:
        return COMBINATORS[comb](inner, **dict(kws), name=_text(tree))
    except SaliencyInputError as e:
        raise SaliencyInputError(f"method {_text(tree)!r}: {e}") from None
