"""Crafted agent and replay files (tests/_support/crafted_files.py builds them from opcodes and raw bytes) are
refused in one `jaxsal: error:` line, exit 2, within seconds and bounded memory, nothing written:
through the Python loaders and `jaxsal explain`, in a subprocess under an address-space limit (a
regression would segfault, hang in C or exhaust memory, which must not take the test run with it).
The pickle reader's bounds are also tested on their own, in process, where they are fast."""
from __future__ import annotations

import gzip
import json
import pickle
import subprocess
import sys
import time
import zipfile

import numpy as np
import pytest

from jaxsal.errors import SaliencyInputError
from jaxsal.io import pickled
from jaxsal.io.pickled import Global, Limits, Opaque, PickleFormatError, PickleLimitError, describe, parse
from jaxsal.loaders import LoaderError, load_file
from tests._support import crafted_files as C
from tests._support import ROOT

ADDRESS_SPACE = 4 << 30  # a normal `jaxsal explain` of a small buffer needs 1.5-2 GiB of address space (JAX)
MAX_RSS_MIB = 1536       # every crafted file together, JAX and torch (when installed) included: ~600 MiB
SECONDS = 20


def _limited(module: str, *args) -> list:
    """`python -m module args` whose address space is limited from its first line (set in the child
    itself: a preexec_fn after fork is unsafe in this multithreaded, JAX-importing process)."""
    n = ADDRESS_SPACE
    start = (f"import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_AS, ({n}, {n})); "
             f"sys.argv = [{module!r}, *sys.argv[1:]]; runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")
    return [sys.executable, "-c", start, *map(str, args)]


@pytest.fixture(scope="module")
def crafted(tmp_path_factory):
    d = tmp_path_factory.mktemp("crafted")
    return d, C.write_catalogue(d)


def test_the_catalogue_is_small_on_disk(crafted):
    d, cases = crafted
    assert len(cases) >= 20
    assert sum(p.stat().st_size for p in d.rglob("*") if p.is_file()) < 32 << 20


def test_every_crafted_file_is_refused_in_one_line_fast_and_in_bounded_memory(crafted):
    d, cases = crafted
    t = time.perf_counter()
    r = subprocess.run(_limited("tests._support.crafted_files", d, *cases), cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    wall = time.perf_counter() - t
    got = {}
    for line in r.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            got[row["name"]] = row
    missing = [n for n in cases if n not in got]
    assert not missing, f"the run stopped (rc {r.returncode}) before {missing[0]!r}: {r.stderr[-800:]}"
    failed = []
    for name, case in cases.items():
        row = got[name]
        lines = [ln for ln in row["stderr"].splitlines() if ln.strip()]
        one = len(lines) == 1 and lines[0].startswith("jaxsal: error: ")
        ok = (row["code"] == 2 and one and case.says in lines[0] and str(case.path) in lines[0]
              and len(lines[0]) < 800 and "internal error" not in lines[0]
              and row["loader"] != "accepted" and case.says in row["loader"]
              and row["loader_s"] < SECONDS and row["cli_s"] < SECONDS and not row["written"])
        if not ok:
            failed.append((name, {k: row[k] for k in ("code", "loader_s", "cli_s", "written")}, row["stderr"][-300:],
                           row["loader"][:200]))
    assert not failed, "\n".join(map(str, failed))
    peak = max(row["maxrss_mib"] for row in got.values())
    assert peak < MAX_RSS_MIB, f"peak RSS {peak:.0f} MiB"
    assert r.returncode == 0 and wall < 300


def _console(argv):
    return subprocess.run(_limited("jaxsal.cli", *argv), cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_the_console_exits_2_with_one_line(crafted, tmp_path):
    """The real console entry point (the exit status a shell sees) on the case that segfaulted."""
    d, cases = crafted
    name = "deep tuple as dict key (10^6 levels)"
    out = tmp_path / "out"
    t = time.perf_counter()
    r = _console(C.cli_argv(cases[name], d, out))
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("jaxsal: error: "), r.stderr[-500:]
    assert cases[name].says in lines[0] and not out.exists() and time.perf_counter() - t < 2 * SECONDS


@pytest.mark.slow  # one JAX start per case (~4 s each)
def test_every_crafted_file_through_the_console(crafted, tmp_path):
    d, cases = crafted
    failed = []
    for i, (name, case) in enumerate(cases.items()):
        out = tmp_path / f"out{i}"
        t = time.perf_counter()
        r = _console(C.cli_argv(case, d, out))
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        if not (r.returncode == 2 and len(lines) == 1 and case.says in lines[0] and not out.exists()
                and time.perf_counter() - t < 2 * SECONDS):
            failed.append((name, r.returncode, r.stderr[-300:]))
    assert not failed, "\n".join(map(str, failed))


# ----------------------------------------------------------------------------- the reader's bounds
def _refused_fast(data, match, **kw):
    t = time.perf_counter()
    with pytest.raises(PickleLimitError, match=match) as e:
        parse(data, **kw)
    assert time.perf_counter() - t < 2 and len(str(e.value)) < 300
    return str(e.value)


def test_nesting_is_bounded_and_named_by_opcode_and_offset():
    msg = _refused_fast(C.as_dict_key(C.deep_tuple(10 ** 6)), "nested deeper than 1000 levels")
    assert msg.startswith("TUPLE1 at byte 1004:")  # PROTO (2 bytes), EMPTY_DICT, EMPTY_TUPLE, 1000 TUPLE1s
    assert parse(C.as_dict_key(C.deep_tuple(999))) is not None
    _refused_fast(C.P4 + b"(" * 2000 + b"]" + b"l" * 2000 + b".", "LIST at byte 3002: nested deeper")


@pytest.mark.parametrize("build", [C.doubled_dup, C.doubled_memo])
def test_shared_subtrees_count_at_every_use(build):
    _refused_fast(C.as_dict_key(build(60)), "shared ones")
    _refused_fast(C.as_set_item(build(60)), "shared ones")
    t = parse(C.P4 + build(20) + C.STOP)  # 2**20 leaves: allowed, and built in linear time and memory
    assert t[0] is t[1] and t[0][0] is t[0][1]


def test_keys_other_than_plain_str_bytes_small_int_are_never_hashed():
    d = parse(C.as_dict_key(C.doubled_dup(20)))
    (k,) = d
    assert isinstance(k, Opaque) and isinstance(k.value, tuple)
    s = parse(C.P4 + b"\x8f(" + b"K\x01" + b"\x8c\x01a" + b"C\x01b" + b"\x8a\x09" + b"\x01" * 9 + b"\x90.")
    plain = {x for x in s if not isinstance(x, Opaque)}
    assert plain == {1, "a", b"b"} and len(s) == 4  # the 72-bit int is kept by identity


def test_global_operands_are_checked_before_hashing():
    _refused_fast(C.stack_global(C.doubled_dup(10), C.ZERO), "must be strings, got a tuple and the int 0")
    _refused_fast(C.stack_global(b"\x8c\x01m", C.doubled_dup(10)), "must be strings, got the string 'm' and a tuple")
    g = parse(C.stack_global(b"\x8c\x05numpy", b"\x8c\x05dtype"))
    assert isinstance(g, Global) and g.is_("numpy", "dtype")


def test_limits_on_items_literals_and_opcodes():
    _refused_fast(pickle.dumps(list(range(100))), "more than 10 items", limits=Limits(items=10))
    _refused_fast(pickle.dumps("x" * 100), "literal of 100 bytes", limits=Limits(literal=99))
    _refused_fast(pickle.dumps(list(range(100))), "more than 50 opcodes", limits=Limits(ops=50))


def test_messages_describe_nodes_without_repr():
    deep = parse(C.P4 + C.doubled_dup(20) + C.STOP)
    assert describe(deep) == "a tuple"
    assert describe(Global("a\nb" * 100, "c")).count("\n") == 0 and len(describe(Global("a" * 10 ** 6, "c"))) < 200
    assert repr(pickled.Call(deep, ())) == "Call(a tuple)"


@pytest.mark.parametrize("proto", range(6))
def test_plain_pickles_read_back_equal(proto):
    obj = {"a": [1, 2.5, None, True, False, "z" * 300], "b": (1, (2, (3,))), 7: -(1 << 70), "": {}}
    if proto >= 3:  # before, bytes are a call of _codecs.encode (and sets of builtins.set, before 4)
        obj.update(e=[b"xy", bytearray(b"ba") if proto >= 5 else b"ba"])
    if proto >= 4:
        obj.update(c={1, "s"}, d=frozenset({b"q"}))
    got = parse(pickle.dumps(obj, protocol=proto))
    assert got == (dict(obj, e=[b"xy", b"ba"]) if proto >= 3 else obj)


def test_malformed_streams_are_limit_errors_not_crashes():
    for data in (b"", b"\x80\x04", b"\x80\x04a.", b"\x80\x04(t(.", b"\x80\x04h\x05.", b"\x80\x04K\x01K\x02.",
                 b"\x80\x04\x8e" + b"\xff" * 8, b"\x80\x04\xfe."):
        with pytest.raises(PickleLimitError):
            parse(data)
    with pytest.raises(PickleFormatError, match="PERSID at byte 2: this opcode is not supported"):
        parse(b"\x80\x04Pid\n.")


@pytest.mark.parametrize("proto", range(6))
@pytest.mark.parametrize("as_numpy", [True, False])
def test_int_sets_in_every_protocol(proto, as_numpy):
    ends = {3, 17, 1 << 40}
    s = {np.int64(i) for i in ends} if as_numpy else set(ends)
    assert pickled.read_int_set(pickle.dumps(s, protocol=proto), 10) == ends
    assert pickled.read_int_set(pickle.dumps(sorted(s), protocol=proto), 10) == ends
    with pytest.raises(PickleLimitError, match="more than 2 items"):
        pickled.read_int_set(pickle.dumps(s, protocol=proto), 2)
    with pytest.raises(PickleFormatError, match="not an integer|not used by the format"):
        pickled.read_int_set(pickle.dumps({1.5}, protocol=proto), 10)


def test_a_params_tree_with_shared_subtrees_is_bounded():
    tree = {}
    for _ in range(40):  # what a stream could build through mutation after sharing
        tree = {"a": tree, "b": tree}
    t = time.perf_counter()
    with pytest.raises(PickleFormatError, match="larger or deeper"):
        pickled.tree_to_arrays(tree)
    assert time.perf_counter() - t < 2


# ----------------------------------------------------------------------------- zip members
def test_a_zip_member_is_read_only_up_to_its_declared_size_and_crc_checked(tmp_path):
    """A header that understates the size: zipfile stops at the declared size and the CRC refuses it."""
    stream, _ = C.deflate_zeros(64 << 20)
    p = tmp_path / "lying.zip"
    p.write_bytes(C.zip_bytes({"data": (stream, 0, 1000)}))
    with zipfile.ZipFile(p) as z:
        assert z.getinfo("data").file_size == 1000
    with pytest.raises(LoaderError, match="cannot read member 'data'.*BadZipFile.*corrupt or crafted"):
        load_file(p)


def test_a_real_gzip_bomb_is_refused_before_it_is_read(tmp_path):
    """The bomb really expands (checked on its first MiB); the reader stops at its limit."""
    p = tmp_path / "bomb.gz"
    p.write_bytes(C.gzip_bomb(1 << 30))
    with gzip.open(p) as f:
        assert f.read(1 << 20) == bytes(1 << 20)
    d = C._dopamine(tmp_path, "dop", "episode_end_indices_ckpt.7.gz", p.read_bytes())
    from jaxsal.io import open_source
    with pytest.raises(SaliencyInputError, match="more than 71936 bytes uncompressed"):
        open_source(d)
