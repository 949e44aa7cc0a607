"""Read a pickle stream as inert, bounded data, never running it: SBX policies and Dopamine's episode ends.

`pickle.loads` imports the classes a stream names and calls them, so a file can run any code.
`parse` walks the same opcodes (pickletools.genops) with a small stack machine that builds only
Python literals (numbers, strings, bytes, tuples, lists, dicts, sets); a class or function
reference becomes an inert `Global(module, name)`, a call (REDUCE/NEWOBJ) an inert
`Call(func, args)` carrying the state a BUILD gives it. Nothing is imported, looked up or called.

A stream is also bounded in what it may build (`Limits`): opcodes, nesting depth, the items of one
container, the bytes of one literal and the logical size of every node (its children counted at
each use, so a subtree shared through DUP or memo GET counts as often as it appears: `(0,)`
doubled 60 times is refused at the 26th doubling, in microseconds). Dict keys and set items are
hashed only when they are plain str, bytes or int (of at most 64 bits); any other key is kept by
identity in an `Opaque` wrapper, so no tuple built by the stream is ever hashed. Errors name the
opcode and its byte offset, never the repr of a node (`describe` gives a short, safe name).

`to_array` turns the array encodings of numpy and JAX into numpy arrays by checking their parts
(dtype code from an allowlist, byte count = shape x item size); `read_int_set` reads a pickled set
of integers (Dopamine's `episode_end_indices`) with only the opcodes and globals such a set needs.

Refused: persistent ids, out-of-band buffers, extension codes and the old INST/OBJ opcodes
(none occur in cloudpickle / protocol-5 streams of numpy, JAX and flax objects).
"""
from __future__ import annotations

import math
import pickletools
from dataclasses import dataclass

import numpy as np

from jaxsal.errors import SaliencyInputError


class PickleFormatError(SaliencyInputError):
    """A stream this reader does not take (an opcode or global outside what it reads)."""


class PickleLimitError(PickleFormatError):
    """A stream no pickler writes: malformed, or past a limit (`Limits`): the file is corrupt or crafted."""


@dataclass(frozen=True)
class Limits:
    """What one stream may build. The depth default is what CPython's pickler can write (it recurses
    once per level, up to its recursion limit of 1000); the others are far above any checkpoint."""
    ops: int = 4_000_000       # opcodes (each pushes at most one node)
    depth: int = 1_000         # nesting of containers and calls
    items: int = 2_000_000     # items of one container
    size: int = 1 << 26        # logical nodes under one node, shared children counted at each use
    literal: int = 1 << 30     # bytes (or characters) of one string / bytes literal


class Global:
    """A class or function the stream names (never imported)."""
    __slots__ = ("module", "name")

    def __init__(self, module: str, name: str):
        self.module, self.name = module, name

    def is_(self, module: str, *names: str) -> bool:
        return self.module == module and self.name in names

    def __repr__(self):
        return f"Global({describe(self)})"


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
        return f"Call({describe(self.func)})"


class Opaque:
    """A dict key or set item that is not a plain str, bytes or small int: kept by identity, never hashed."""
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


def _text(s: str, n: int = 60) -> str:
    """A string from the stream, short, quoted and on one line."""
    return ascii(s[:n]) + ("..." if len(s) > n else "")


def describe(node) -> str:
    """A short name of a node for messages: its type, or a Global's dotted name (never a repr)."""
    if isinstance(node, Global):
        return ".".join(ascii(s[:60])[1:-1] + ("..." if len(s) > 60 else "") for s in (node.module, node.name))
    if isinstance(node, Call):
        return f"a call of {describe(node.func) if isinstance(node.func, Global) else _a(node.func)}"
    if isinstance(node, str):
        return f"the string {_text(node)}"
    if isinstance(node, (bool, int, float)) and (not isinstance(node, int) or node.bit_length() <= 64):
        return f"the {type(node).__name__} {node}"
    return _a(node)


def _a(node) -> str:
    name = type(node).__name__
    return f"a{'n' if name[0] in 'aeiouAEIOU' else ''} {name}"


def _key(k):
    """k itself where hashing it is cheap and bounded; otherwise an identity wrapper."""
    if type(k) in (str, bytes) or (type(k) in (int, bool) and k.bit_length() <= 64):
        return k
    return Opaque(k)


_LEAF = (1, 0)  # (logical size, depth) of a literal or a Global
_LITERAL_OPS = {"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT",
                "STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE",
                "SHORT_BINUNICODE", "BINUNICODE8", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8"}
_SETSTATE = ("_function_setstate", "_class_setstate")  # cloudpickle's state setters


class _Machine:
    """The stack machine of `parse`; `meta` holds (node, logical size, depth) of every container it
    built, by id (the node is kept there so an id is never reused while parsing)."""

    def __init__(self, limits: Limits, allowed_ops, allowed_globals):
        self.lim, self.ops, self.globals = limits, allowed_ops, allowed_globals
        self.stack: list = []
        self.marks: list = []  # stack lengths at each MARK
        self.memo: dict = {}
        self.meta: dict = {}
        self.op, self.pos = "", 0

    def fail(self, why: str, error=PickleLimitError):
        raise error(f"{self.op} at byte {self.pos}: {why}")

    def _floor(self) -> int:
        return self.marks[-1] if self.marks else 0

    def pop(self):
        if len(self.stack) <= self._floor():
            self.fail("the stack is empty")
        return self.stack.pop()

    def top(self):
        if len(self.stack) <= self._floor():
            self.fail("the stack is empty")
        return self.stack[-1]

    def pop_mark(self) -> list:
        if not self.marks:
            self.fail("no MARK before it")
        m = self.marks.pop()
        items = self.stack[m:]
        del self.stack[m:]
        return items

    def _info(self, x):
        m = self.meta.get(id(x))
        return (m[1], m[2]) if m is not None else _LEAF

    def _grow(self, size: int, depth: int, children) -> tuple[int, int]:
        for c in children:
            s, d = self._info(c)
            size += s
            depth = max(depth, d + 1)
        if depth > self.lim.depth:
            self.fail(f"nested deeper than {self.lim.depth} levels (no pickler writes that)")
        if size > self.lim.size:
            self.fail(f"builds a node of more than {self.lim.size} parts counting shared ones at each use "
                      "(a subtree repeated through DUP or memo GET)")
        return size, depth

    def new(self, node, children=()):
        """Push a new container or call built from `children`."""
        if isinstance(node, (list, dict, set, frozenset, tuple)) and len(node) > self.lim.items:
            self.fail(f"a container of more than {self.lim.items} items")
        size, depth = self._grow(1, 1, children)
        self.meta[id(node)] = (node, size, depth)
        self.stack.append(node)

    def add(self, node, children, count: int = 0):
        """Record that container or call `node` now also holds `children` (`count` more items)."""
        held = len(node.items) + len(node.dictitems) if isinstance(node, Call) else len(node)
        if count and held > self.lim.items:
            self.fail(f"a container of more than {self.lim.items} items")
        m = self.meta.get(id(node))
        if m is None:
            self.fail(f"{describe(node)} cannot take items")
        size, depth = self._grow(m[1], m[2], children)
        self.meta[id(node)] = (node, size, depth)

    def literal(self, arg):
        if isinstance(arg, (str, bytes, bytearray)) and len(arg) > self.lim.literal:
            self.fail(f"a literal of {len(arg)} bytes, more than {self.lim.literal}")
        self.stack.append(bytes(arg) if isinstance(arg, bytearray) else arg)

    def global_(self, module, name):
        if not (type(module) is str and type(name) is str):  # checked before anything hashes them
            self.fail(f"module and name must be strings, got {describe(module)} and {describe(name)}")
        if self.globals is not None and (module, name) not in self.globals:
            self.fail(f"it names {describe(Global(module, name))}", PickleFormatError)
        self.stack.append(Global(module, name))


def parse(data: bytes, limits: Limits = Limits(), allowed_ops=None, allowed_globals=None):
    """The object tree of a pickle stream, with every class and call left inert (module docstring).
    `allowed_ops` / `allowed_globals` ({(module, name)}), when given, refuse any other opcode or name."""
    m = _Machine(limits, allowed_ops, allowed_globals)
    stack, memo = m.stack, m.memo
    try:
        for count, (op, arg, pos) in enumerate(pickletools.genops(data)):
            n = m.op = op.name
            m.pos = pos
            if count >= limits.ops:
                m.fail(f"more than {limits.ops} opcodes")
            if allowed_ops is not None and n not in allowed_ops:
                m.fail("this opcode is not used by the format read here", PickleFormatError)
            if n in ("PROTO", "FRAME"):
                continue
            if n == "STOP":
                if len(stack) != 1 or m.marks:
                    m.fail("the stack does not hold exactly one object")
                return stack.pop()
            if n in _LITERAL_OPS:
                m.literal(arg)
            elif n == "MEMOIZE":
                memo[len(memo)] = m.top()
            elif n in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[arg] = m.top()
            elif n in ("GET", "BINGET", "LONG_BINGET"):
                if arg not in memo:
                    m.fail(f"memo entry {arg} was never stored")
                stack.append(memo[arg])
            elif n == "MARK":
                m.marks.append(len(stack))
            elif n == "POP":
                if len(stack) > m._floor():
                    stack.pop()
                else:  # CPython's unpickler: POP right after MARK drops the mark
                    m.pop_mark()
            elif n == "POP_MARK":
                m.pop_mark()
            elif n == "DUP":
                stack.append(m.top())
            elif n == "NONE":
                stack.append(None)
            elif n in ("NEWTRUE", "NEWFALSE"):
                stack.append(n == "NEWTRUE")
            elif n == "EMPTY_TUPLE":
                stack.append(())
            elif n in ("TUPLE1", "TUPLE2", "TUPLE3"):
                items = [m.pop() for _ in range(int(n[-1]))][::-1]
                m.new(tuple(items), items)
            elif n == "TUPLE":
                items = m.pop_mark()
                m.new(tuple(items), items)
            elif n == "EMPTY_LIST":
                m.new([])
            elif n == "LIST":
                items = m.pop_mark()
                m.new(items, items)
            elif n in ("APPEND", "APPENDS"):
                items = [m.pop()] if n == "APPEND" else m.pop_mark()
                target = m.top()
                if isinstance(target, list):
                    target.extend(items)
                elif isinstance(target, Call):
                    target.items.extend(items)
                else:
                    m.fail(f"{n} on {describe(target)}")
                m.add(target, items, len(items))
            elif n == "EMPTY_DICT":
                m.new({})
            elif n == "DICT":
                it = m.pop_mark()
                if len(it) % 2:
                    m.fail("an odd number of keys and values")
                m.new({_key(k): v for k, v in zip(it[::2], it[1::2])}, it)
            elif n in ("SETITEM", "SETITEMS"):
                if n == "SETITEM":
                    v = m.pop()
                    it = [m.pop(), v]
                else:
                    it = m.pop_mark()
                    if len(it) % 2:
                        m.fail("an odd number of keys and values")
                target = m.top()
                d = target if isinstance(target, dict) else target.dictitems if isinstance(target, Call) else None
                if d is None:
                    m.fail(f"{n} on {describe(target)}")
                for k, v in zip(it[::2], it[1::2]):
                    d[_key(k)] = v
                m.add(target, it, len(it))
            elif n == "EMPTY_SET":
                m.new(set())
            elif n == "ADDITEMS":
                it = m.pop_mark()
                target = m.top()
                if not isinstance(target, set):
                    m.fail(f"ADDITEMS on {describe(target)}")
                target.update(_key(x) for x in it)
                m.add(target, it, len(it))
            elif n == "FROZENSET":
                it = m.pop_mark()
                m.new(frozenset(_key(x) for x in it), it)
            elif n == "GLOBAL":
                module, _, name = arg.partition(" ")
                m.global_(module, name)
            elif n == "STACK_GLOBAL":
                name = m.pop()
                m.global_(m.pop(), name)
            elif n == "REDUCE":
                args = m.pop()
                func = m.pop()
                if isinstance(func, Global) and func.name in _SETSTATE and isinstance(args, tuple) \
                        and len(args) == 2 and isinstance(args[0], Call):
                    args[0].state = args[1]  # cloudpickle's state setter: record, do not call
                    m.add(args[0], [args[1]])
                m.new(Call(func, args), (func, args))
            elif n == "NEWOBJ":
                args = m.pop()
                cls = m.pop()
                m.new(Call(cls, args), (cls, args))
            elif n == "NEWOBJ_EX":
                kwargs, args = m.pop(), m.pop()
                cls = m.pop()
                m.new(Call(cls, (args, kwargs)), (cls, args, kwargs))
            elif n == "BUILD":
                state = m.pop()
                target = m.top()
                if isinstance(target, Call):
                    target.state = state
                    m.add(target, [state])
            else:  # persistent ids, out-of-band buffers, extension registry, INST/OBJ
                m.fail("this opcode is not supported", PickleFormatError)
    except PickleFormatError:
        raise
    except (ValueError, TypeError, OverflowError) as e:  # genops: a malformed opcode or argument
        where = f"at byte {m.pos} (after {m.op})" if m.op else "at its start"
        why = str(e).splitlines()[0][:120] if str(e) else ""
        raise PickleLimitError(f"malformed pickle stream {where}: {type(e).__name__}: {why}") from None
    raise PickleLimitError("the pickle stream ends without STOP")


_DTYPES = {"f2", "f4", "f8", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "b1"}
_NUMPY = ("numpy", "numpy.core.multiarray", "numpy._core.multiarray", "numpy.core.numeric",
          "numpy._core.numeric")


def to_dtype(node, codes=_DTYPES) -> np.dtype:
    """np.dtype from numpy's pickled dtype: Call(numpy.dtype, (code, False, True)) + state."""
    code = node.args[0] if isinstance(node, Call) and isinstance(node.args, tuple) and node.args else None
    if not (isinstance(node, Call) and node.of("numpy", "dtype") and type(code) is str and code in codes):
        raise PickleFormatError(f"not a plain numeric numpy dtype: {describe(node)}")
    order = node.state[1] if isinstance(node.state, tuple) and len(node.state) > 1 else "|"
    if order not in ("<", ">", "|", "="):
        raise PickleFormatError(f"unknown byte order: {describe(order)}")
    return np.dtype(("" if order in ("|", "=") else order) + code)


def _shape(v) -> tuple:
    if not (isinstance(v, tuple) and len(v) <= 32
            and all(type(d) is int and 0 <= d < 1 << 62 for d in v)):
        raise PickleFormatError(f"bad array shape: {describe(v)}")
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
    raise PickleFormatError(f"not an array: {describe(node)}")


def _ndarray_node(fun, args, state) -> Call:
    node = Call(fun, args)
    node.state = state
    return node


def tree_to_arrays(tree, budget: list | None = None, depth: int = 0):
    """A nested dict of pickled arrays (a flax params tree; FrozenDict too) as numpy arrays; at most
    64 levels and 100,000 nodes are visited (a params tree has a few levels and hundreds of leaves)."""
    budget = [100_000] if budget is None else budget
    budget[0] -= 1
    if budget[0] < 0 or depth > 64:
        raise PickleFormatError("params tree larger or deeper than any network's")
    if isinstance(tree, Call) and tree.of("flax.core.frozen_dict", "FrozenDict"):
        inner = tree.args[0] if isinstance(tree.args, tuple) and tree.args else tree.state
        return tree_to_arrays(inner, budget, depth + 1)
    if isinstance(tree, dict):
        if not all(type(k) is str for k in tree):
            raise PickleFormatError("params tree with non-string keys")
        return {k: tree_to_arrays(v, budget, depth + 1) for k, v in tree.items()}
    return to_array(tree)


# ----------------------------------------------------------------------------- a set of integers
INT_SET_OPS = frozenset({
    "PROTO", "FRAME", "STOP", "MARK", "MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT", "GET", "BINGET", "LONG_BINGET",
    "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "NONE", "NEWTRUE", "NEWFALSE",
    "STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8",
    "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3",
    "EMPTY_LIST", "LIST", "APPEND", "APPENDS", "EMPTY_SET", "ADDITEMS", "FROZENSET",
    "GLOBAL", "STACK_GLOBAL", "REDUCE", "BUILD"})
_SCALAR = {(m, "scalar") for m in ("numpy._core.multiarray", "numpy.core.multiarray")}
_SETS = {(m, n) for m in ("builtins", "__builtin__") for n in ("set", "frozenset")}
INT_SET_GLOBALS = frozenset(_SCALAR | _SETS | {("numpy", "dtype"), ("_codecs", "encode")})
_INT_CODES = {"i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8"}


def _bytes(node):
    """bytes, or protocol 2's _codecs.encode(text, 'latin1') of them."""
    if type(node) is bytes:
        return node
    if isinstance(node, Call) and node.of("_codecs", "encode") and isinstance(node.args, tuple) \
            and len(node.args) == 2 and type(node.args[0]) is str and node.args[1] == "latin1":
        try:
            return node.args[0].encode("latin1")
        except UnicodeEncodeError:
            pass
    raise PickleFormatError(f"expected bytes, found {describe(node)}")


def _int(node) -> int:
    if isinstance(node, Opaque):
        node = node.value
    if type(node) is int and node.bit_length() <= 64:
        return node
    if isinstance(node, Call) and isinstance(node.func, Global) \
            and (node.func.module, node.func.name) in _SCALAR and isinstance(node.args, tuple) and len(node.args) == 2:
        dt = to_dtype(node.args[0], _INT_CODES)
        raw = _bytes(node.args[1])
        if len(raw) != dt.itemsize:
            raise PickleFormatError(f"a numpy {dt} scalar of {len(raw)} bytes")
        return int(np.frombuffer(raw, dt)[0])
    raise PickleFormatError(f"it holds {describe(node)}, not an integer")


def read_int_set(data: bytes, max_items: int) -> set[int]:
    """The set (or list) of integers pickled in `data` (Python or numpy ints, set() or {...},
    protocols 0-5), at most `max_items` of them, read with only the opcodes and globals such a set
    needs and within limits proportional to `max_items`."""
    lim = Limits(ops=32 * max_items + 1024, depth=8, items=max_items, size=64 * max_items + 1024)
    root = parse(data, lim, INT_SET_OPS, INT_SET_GLOBALS)
    if isinstance(root, Call) and isinstance(root.func, Global) and (root.func.module, root.func.name) in _SETS:
        args = root.args if isinstance(root.args, tuple) else None
        if args is None or len(args) > 1 or (args and not isinstance(args[0], (list, tuple, set, frozenset))):
            raise PickleFormatError("set() of something other than a list")
        root = args[0] if args else []
    if not isinstance(root, (set, frozenset, list)):
        raise PickleFormatError(f"it holds {describe(root)}, not a set of integers")
    return {_int(x) for x in root}
