"""Read a pickle stream as inert data, never running it: for checkpoints that embed weights in pickles.

`pickle.loads` imports the classes a stream names and calls them, so a file can run any code.
`parse` walks the same opcodes (pickletools.genops) with a small stack machine that builds only
Python literals (numbers, strings, bytes, tuples, lists, dicts, sets); a class or function
reference becomes an inert `Global(module, name)`, a call (REDUCE/NEWOBJ) an inert
`Call(func, args)` carrying the state a BUILD gives it. Nothing is imported, looked up or
called. `to_array` then turns the few array encodings of numpy and JAX into numpy arrays by
checking their parts (dtype code from an allowlist, byte count = shape x item size) and
copying the bytes with np.frombuffer.

Refused: persistent ids, out-of-band buffers, extension codes and the old INST/OBJ opcodes
(none occur in cloudpickle / protocol-5 streams of numpy, JAX and flax objects).
"""
from __future__ import annotations

import math
import pickletools

import numpy as np


class Global:
    """A class or function the stream names (never imported)."""
    __slots__ = ("module", "name")

    def __init__(self, module: str, name: str):
        self.module, self.name = module, name

    def is_(self, module: str, *names: str) -> bool:
        return self.module == module and self.name in names

    def __repr__(self):
        return f"Global({self.module}.{self.name})"


class Call:
    """func(*args) as the stream would have called it (never called), plus BUILD state and
    appended items (list/dict subclasses)."""
    __slots__ = ("func", "args", "state", "items", "dictitems")

    def __init__(self, func, args):
        self.func, self.args, self.state = func, args, None
        self.items, self.dictitems = [], {}

    def of(self, module: str, *names: str) -> bool:
        return isinstance(self.func, Global) and self.func.is_(module, *names)

    def __repr__(self):
        return f"Call({self.func!r})"


class PickleFormatError(ValueError):
    """A stream this reader does not take (unsupported opcode, malformed stack)."""


_MARK = object()
_LITERAL_OPS = {"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT",
                "STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE",
                "SHORT_BINUNICODE", "BINUNICODE8", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8"}
_SETSTATE = ("_function_setstate", "_class_setstate")  # cloudpickle's state setters


class _Unhashable:
    """An unhashable dict key or set item (e.g. a list), kept by identity."""
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


def _key(k):
    """Dict keys and set items must be hashable (inert nodes hash by identity)."""
    try:
        hash(k)
        return k
    except TypeError:
        return _Unhashable(k)


def parse(data: bytes):
    """The object tree of a pickle stream, with every class and call left inert."""
    stack: list = []
    memo: dict = {}

    def pop_mark() -> list:
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] is _MARK:
                items = stack[i + 1:]
                del stack[i:]
                return items
        raise PickleFormatError("MARK expected on the stack")

    try:
        for op, arg, _ in pickletools.genops(data):
            n = op.name
            if n in ("PROTO", "FRAME"):
                continue
            if n == "STOP":
                if len(stack) != 1:
                    raise PickleFormatError("stack not empty at STOP")
                return stack.pop()
            if n in _LITERAL_OPS:
                stack.append(arg)
            elif n == "MEMOIZE":
                memo[len(memo)] = stack[-1]
            elif n in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[arg] = stack[-1]
            elif n in ("GET", "BINGET", "LONG_BINGET"):
                stack.append(memo[arg])
            elif n == "MARK":
                stack.append(_MARK)
            elif n == "POP":
                stack.pop()
            elif n == "POP_MARK":
                pop_mark()
            elif n == "DUP":
                stack.append(stack[-1])
            elif n == "NONE":
                stack.append(None)
            elif n in ("NEWTRUE", "NEWFALSE"):
                stack.append(n == "NEWTRUE")
            elif n == "BYTEARRAY8":
                stack.append(bytes(arg))
            elif n == "EMPTY_TUPLE":
                stack.append(())
            elif n in ("TUPLE1", "TUPLE2", "TUPLE3"):
                k = int(n[-1])
                if len(stack) < k:
                    raise PickleFormatError(f"{n} on a short stack")
                stack[-k:] = [tuple(stack[-k:])]
            elif n == "TUPLE":
                stack.append(tuple(pop_mark()))
            elif n == "EMPTY_LIST":
                stack.append([])
            elif n == "LIST":
                stack.append(pop_mark())
            elif n in ("APPEND", "APPENDS"):
                items = [stack.pop()] if n == "APPEND" else pop_mark()
                target = stack[-1]
                (target if isinstance(target, list) else _items(target)).extend(items)
            elif n == "EMPTY_DICT":
                stack.append({})
            elif n == "DICT":
                it = pop_mark()
                stack.append({_key(k): v for k, v in zip(it[::2], it[1::2])})
            elif n in ("SETITEM", "SETITEMS"):
                if n == "SETITEM":
                    v = stack.pop()
                    it = [stack.pop(), v]
                else:
                    it = pop_mark()
                target = stack[-1]
                d = target if isinstance(target, dict) else _dictitems(target)
                for k, v in zip(it[::2], it[1::2]):
                    d[_key(k)] = v
            elif n == "EMPTY_SET":
                stack.append(set())
            elif n == "ADDITEMS":
                it = pop_mark()
                target = stack[-1]
                if not isinstance(target, set):
                    raise PickleFormatError("ADDITEMS on a non-set")
                target.update(_key(x) for x in it)
            elif n == "FROZENSET":
                stack.append(frozenset(_key(x) for x in pop_mark()))
            elif n == "GLOBAL":
                module, _, name = arg.partition(" ")
                stack.append(Global(module, name))
            elif n == "STACK_GLOBAL":
                name, module = stack.pop(), stack.pop()
                if not isinstance(name, str) or not isinstance(module, str):
                    raise PickleFormatError("STACK_GLOBAL needs two strings")
                stack.append(Global(module, name))
            elif n == "REDUCE":
                args, func = stack.pop(), stack.pop()
                if isinstance(func, Global) and func.name in _SETSTATE and isinstance(args, tuple) \
                        and len(args) == 2 and isinstance(args[0], Call):
                    args[0].state = args[1]  # cloudpickle's state setter: record, do not call
                stack.append(Call(func, args))
            elif n == "NEWOBJ":
                args, cls = stack.pop(), stack.pop()
                stack.append(Call(cls, args))
            elif n == "NEWOBJ_EX":
                kwargs, args, cls = stack.pop(), stack.pop(), stack.pop()
                stack.append(Call(cls, (args, kwargs)))
            elif n == "BUILD":
                state = stack.pop()
                if isinstance(stack[-1], Call):
                    stack[-1].state = state
            else:  # persistent ids, out-of-band buffers, extension registry, INST/OBJ
                raise PickleFormatError(f"pickle opcode {n} is not supported")
    except PickleFormatError:
        raise
    except (IndexError, KeyError, ValueError, TypeError) as e:
        raise PickleFormatError(f"malformed pickle stream ({type(e).__name__}: {e})") from None
    raise PickleFormatError("pickle stream ends without STOP")


def _items(node):
    if not isinstance(node, Call):
        raise PickleFormatError("APPEND on a non-list")
    return node.items


def _dictitems(node):
    if not isinstance(node, Call):
        raise PickleFormatError("SETITEM on a non-dict")
    return node.dictitems


_DTYPES = {"f2", "f4", "f8", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "b1"}
_NUMPY = ("numpy", "numpy.core.multiarray", "numpy._core.multiarray", "numpy.core.numeric",
          "numpy._core.numeric")


def to_dtype(node) -> np.dtype:
    """np.dtype from numpy's pickled dtype: Call(numpy.dtype, (code, False, True)) + state."""
    if not (isinstance(node, Call) and node.of("numpy", "dtype") and isinstance(node.args, tuple)
            and node.args and node.args[0] in _DTYPES):
        raise PickleFormatError(f"not a plain numeric numpy dtype: {node!r}")
    order = node.state[1] if isinstance(node.state, tuple) and len(node.state) > 1 else "|"
    if order not in ("<", ">", "|", "="):
        raise PickleFormatError(f"unknown byte order {order!r}")
    return np.dtype(("" if order in ("|", "=") else order) + node.args[0])


def _shape(v) -> tuple:
    if not isinstance(v, tuple) or not all(isinstance(d, int) and d >= 0 for d in v):
        raise PickleFormatError(f"bad array shape {v!r}")
    return v


def _from_bytes(raw, dtype: np.dtype, shape: tuple, fortran: bool) -> np.ndarray:
    if not isinstance(raw, bytes):
        raise PickleFormatError("array data is not bytes")
    if len(raw) != math.prod(shape) * dtype.itemsize:
        raise PickleFormatError(f"array data has {len(raw)} bytes, not {math.prod(shape)} x "
                                f"{dtype.itemsize} for shape {shape}")
    a = np.frombuffer(raw, dtype).reshape(shape, order="F" if fortran else "C")
    return a.astype(dtype.newbyteorder("="), copy=True)


def to_array(node) -> np.ndarray:
    """A numpy array from the pickled forms of a numpy or JAX array (see the module docstring)."""
    if isinstance(node, Call) and node.of("jax._src.array", "_reconstruct_array"):
        if not (isinstance(node.args, tuple) and len(node.args) == 4):
            raise PickleFormatError("unexpected jax array pickle")
        fun, args, arr_state, _aval = node.args
        return to_array(_ndarray_node(fun, args, arr_state))
    if isinstance(node, Call) and any(node.of(m, "_reconstruct") for m in _NUMPY):
        st = node.state
        if not (isinstance(st, tuple) and len(st) == 5 and st[0] == 1):
            raise PickleFormatError("unexpected numpy array state")
        _, shape, dtype, fortran, raw = st
        return _from_bytes(raw, to_dtype(dtype), _shape(shape), bool(fortran))
    if isinstance(node, Call) and any(node.of(m, "_frombuffer") for m in _NUMPY):
        if not (isinstance(node.args, tuple) and len(node.args) == 4):
            raise PickleFormatError("unexpected numpy _frombuffer pickle")
        raw, dtype, shape, order = node.args
        return _from_bytes(raw, to_dtype(dtype), _shape(shape), order == "F")
    raise PickleFormatError(f"not an array: {node!r}")


def _ndarray_node(fun, args, state) -> Call:
    node = Call(fun, args)
    node.state = state
    return node


def tree_to_arrays(tree):
    """A nested dict of pickled arrays (a flax params tree; FrozenDict too) as numpy arrays."""
    if isinstance(tree, Call) and tree.of("flax.core.frozen_dict", "FrozenDict"):
        inner = tree.args[0] if isinstance(tree.args, tuple) and tree.args else tree.state
        return tree_to_arrays(inner)
    if isinstance(tree, dict):
        if not all(isinstance(k, str) for k in tree):
            raise PickleFormatError("params tree with non-string keys")
        return {k: tree_to_arrays(v) for k, v in tree.items()}
    return to_array(tree)
