"""Griffe extension: document jaxsal's public functions under their public names.

Several public functions of `jaxsal` are re-exported from modules of the same name
(`jaxsal.rise` from `jaxsal.perturbation.rise`, ...), and the CAM methods are made at import time by `jaxsal.register_cam`, so
static analysis finds a module (or a bare attribute) where a user finds a function. This
extension imports jaxsal and puts each public function of `PUBLIC` into the `jaxsal` package
under its own name, with its runtime signature and docstring. Pages then write
`::: jaxsal.gradcam`, never an internal module path.
"""
from __future__ import annotations

import importlib
import inspect

import griffe

PACKAGE = "jaxsal"


def _public_functions(mod) -> list[str]:
    names = ["explain", "methods", "cam_methods", "method_options", "options_table", "register", "unregister",
             "register_cam", "noise_tunnel", "path_integral", "layer_calls", "with_rule", "rise_masks", "load_maps",
             "load_outputs", "load_object_shares", "params_checksum"]
    return names + [m for m in mod.methods() if m not in names]


def _expr(value) -> str:
    if isinstance(value, str):
        return value
    return getattr(value, "__name__", None) or repr(value)


def _function(name: str, obj, parent) -> griffe.Function:
    params = []
    for p in inspect.signature(obj).parameters.values():
        params.append(griffe.Parameter(
            p.name, kind=griffe.ParameterKind(p.kind.description),
            annotation=None if p.annotation is inspect.Parameter.empty else _expr(p.annotation),
            default=None if p.default is inspect.Parameter.empty else repr(p.default)))
    fn = griffe.Function(name, parameters=griffe.Parameters(*params), parent=parent)
    doc = inspect.getdoc(obj)
    if doc:
        fn.docstring = griffe.Docstring(doc, parent=fn, parser="google", parser_options={"returns_named_value": False})
    return fn


class PublicNames(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
        if pkg.name != PACKAGE:
            return
        mod = importlib.import_module(PACKAGE)
        for name in _public_functions(mod):
            obj = getattr(mod, name)
            if not callable(obj):
                raise TypeError(f"{PACKAGE}.{name} is not a function")
            member = pkg.members.get(name)
            fn = _function(name, obj, pkg)
            if member is not None and member.is_module:
                # keep the submodule reachable for cross-references under its own path
                pkg.del_member(name)
            pkg.set_member(name, fn)
