"""A set of integers from a pickle, read from its opcodes without unpickling.

Dopamine's replay buffer pickles one attribute, `episode_end_indices` (a set of buffer indices,
numpy or Python integers). `pickletools.genops` parses the stream and never executes it; the few
opcodes such a set needs are interpreted here, nothing is imported or called, and anything but a
set or list of integers is refused.
"""
from __future__ import annotations

import gzip
import pickletools
import re
from pathlib import Path

import numpy as np

from jaxsal.errors import SaliencyInputError

_GLOBALS = {("numpy._core.multiarray", "scalar"): "scalar", ("numpy.core.multiarray", "scalar"): "scalar",
            ("numpy", "dtype"): "dtype", ("builtins", "set"): "set", ("__builtin__", "set"): "set",
            ("builtins", "frozenset"): "set", ("__builtin__", "frozenset"): "set", ("_codecs", "encode"): "encode"}
_INT_CODE = re.compile(r"^[<>|=]?[iu][1248]$")
_PUSH = {"BININT", "BININT1", "BININT2", "INT", "LONG", "LONG1", "LONG4", "SHORT_BINUNICODE", "BINUNICODE",
         "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING", "STRING", "SHORT_BINBYTES", "BINBYTES",
         "BINBYTES8"}


class _Callable(str):
    """One of the few globals such a pickle names (a name only: nothing is imported)."""


class _DType:
    def __init__(self, code: str):
        if not isinstance(code, str) or not _INT_CODE.match(code):
            raise ValueError(f"dtype {code!r} is not an integer dtype")
        self.code, self.order = code, "="


def _apply(fn: _Callable, args):
    if not isinstance(args, tuple):
        raise ValueError("call without an argument tuple")
    if fn == "dtype":
        return _DType(args[0])
    if fn == "scalar":
        if len(args) != 2 or not isinstance(args[0], _DType) or not isinstance(args[1], bytes):
            raise ValueError("numpy scalar without an integer dtype and its bytes")
        dt = np.dtype(args[0].code)
        if args[0].order in "<>":
            dt = dt.newbyteorder(args[0].order)
        if len(args[1]) != dt.itemsize:
            raise ValueError("numpy scalar of the wrong size")
        return int(np.frombuffer(args[1], dt)[0])
    if fn == "encode":  # protocol 2 writes bytes as _codecs.encode(text, 'latin1')
        if len(args) != 2 or not isinstance(args[0], str) or args[1] != "latin1":
            raise ValueError("unexpected _codecs.encode call")
        return args[0].encode("latin1")
    if fn == "set":
        if len(args) > 1 or (args and not isinstance(args[0], (list, tuple, set))):
            raise ValueError("set() of something other than a list")
        return set(args[0]) if args else set()
    raise ValueError(f"call of {fn}")


def read_pickled_int_set(path: Path) -> set:
    """The set of integers Dopamine pickled into `path` (gzip'd), without unpickling it."""
    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as e:
        raise SaliencyInputError(f"cannot read {path}: not a gzip file ({e})") from None
    stack, memo, marks = [], {}, []
    try:
        for op, arg, _ in pickletools.genops(data):
            name = op.name
            if name in ("PROTO", "FRAME"):
                continue
            if name == "STOP":
                break
            if name == "MARK":
                marks.append(len(stack))
            elif name in _PUSH:
                stack.append(arg)
            elif name in ("NONE", "NEWTRUE", "NEWFALSE"):
                stack.append({"NONE": None, "NEWTRUE": True, "NEWFALSE": False}[name])
            elif name in ("EMPTY_SET", "EMPTY_LIST", "EMPTY_TUPLE"):
                stack.append({"EMPTY_SET": set, "EMPTY_LIST": list, "EMPTY_TUPLE": tuple}[name]())
            elif name == "MEMOIZE":
                memo[len(memo)] = stack[-1]
            elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[arg] = stack[-1]
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                stack.append(memo[arg])
            elif name in ("TUPLE", "FROZENSET", "ADDITEMS", "APPENDS"):
                m = marks.pop()
                items = stack[m:]
                del stack[m:]
                if name == "TUPLE":
                    stack.append(tuple(items))
                elif name == "FROZENSET":
                    stack.append(set(items))
                elif name == "ADDITEMS" and isinstance(stack[-1], set):
                    stack[-1].update(items)
                elif name == "APPENDS" and isinstance(stack[-1], list):
                    stack[-1].extend(items)
                else:
                    raise ValueError(f"{name} on a {type(stack[-1]).__name__}")
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                n = int(name[-1])
                items = tuple(stack[-n:])
                del stack[-n:]
                stack.append(items)
            elif name == "APPEND" and isinstance(stack[-2], list):
                stack[-2].append(stack.pop())
            elif name in ("GLOBAL", "STACK_GLOBAL"):
                if name == "GLOBAL":
                    module, attr = arg.split(" ", 1)
                else:
                    attr, module = stack.pop(), stack.pop()
                if (module, attr) not in _GLOBALS:
                    raise ValueError(f"it names {module}.{attr}")
                stack.append(_Callable(_GLOBALS[(module, attr)]))
            elif name == "REDUCE":
                args, fn = stack.pop(), stack.pop()
                if not isinstance(fn, _Callable):
                    raise ValueError("call of a non-function")
                stack.append(_apply(fn, args))
            elif name == "BUILD":
                state, obj = stack.pop(), stack[-1]
                if not (isinstance(obj, _DType) and isinstance(state, tuple) and len(state) > 1
                        and state[1] in ("<", ">", "|", "=")):
                    raise ValueError("BUILD of something other than a numpy dtype")
                obj.order = state[1]
            else:
                raise ValueError(f"pickle opcode {name}")
        result = stack[-1]
        if not isinstance(result, (set, list)) or not all(
                isinstance(x, int) and not isinstance(x, bool) for x in result):
            raise ValueError(f"it holds a {type(result).__name__}, not a set of integers")
    except (ValueError, IndexError, KeyError, TypeError) as e:
        raise SaliencyInputError(f"{path}: not the set of episode-end indices Dopamine writes ({e}); use the "
                                 "file saved with this checkpoint, or remove it (then time-outs are not "
                                 "known, as when Dopamine loads a checkpoint without it)") from None
    return set(result)
