"""Crafted agent and replay files, built here from pickle opcodes and raw zip/gzip bytes (nothing is
committed): what an attacker or a broken disk hands jaxsal. Each must be refused in one line.

`catalogue(d)` writes every case under `d` and returns {name: Case}; `python -m tests._support.crafted_files
DIR NAME...` (what tests/io/test_crafted_files.py runs, under a memory limit) loads each named case with
the Python loader and with `jaxsal explain`, and prints one JSON line per case.
"""
from __future__ import annotations

import base64
import json
import shutil
import struct
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tests._support.dopamine_buffers import FIXTURE

P4 = b"\x80\x04"
EMPTY_TUPLE, TUPLE1, TUPLE2, DUP, STOP = b")", b"\x85", b"\x86", b"2", b"."
ZERO = b"K\x00"  # BININT1 0

AGENT_PY = '''
import flax.linen as nn
import jax
import jax.numpy as jnp


class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(3)(x.reshape((x.shape[0], -1)).astype(jnp.float32) / 255.0)


def load():
    net = Net()
    return net.apply, net.init(jax.random.PRNGKey(0), jnp.zeros((1, 10, 10, 4)))
'''


# ----------------------------------------------------------------------------- pickles from opcodes
def deep_tuple(levels: int) -> bytes:
    """((((),),),) nested `levels` deep: one TUPLE1 byte per level."""
    return EMPTY_TUPLE + TUPLE1 * levels


def doubled_dup(times: int) -> bytes:
    """(0,) doubled `times` times through DUP: t = (t, t); 2**times leaves in 2 bytes per doubling."""
    return ZERO + TUPLE1 + (DUP + TUPLE2) * times


def doubled_memo(times: int) -> bytes:
    """The same through the memo: BINPUT 0, BINGET 0, TUPLE2."""
    return ZERO + TUPLE1 + (b"q\x00h\x00" + TUPLE2) * times


def as_dict_key(node: bytes) -> bytes:
    return P4 + b"}" + node + b"Ns" + STOP          # EMPTY_DICT, key, NONE, SETITEM


def as_set_item(node: bytes) -> bytes:
    return P4 + b"\x8f(" + node + b"\x90" + STOP     # EMPTY_SET, MARK, item, ADDITEMS


def as_called(node: bytes) -> bytes:
    return P4 + node + EMPTY_TUPLE + b"R" + STOP      # node(*()) via REDUCE: a policy "class"


def stack_global(module: bytes, name: bytes) -> bytes:
    return P4 + module + name + b"\x93" + STOP        # STACK_GLOBAL


def dtype_of(node: bytes) -> bytes:
    """numpy.dtype(node): the node where a dtype code is expected (an error message names it)."""
    return P4 + b"\x8f(" + b"cnumpy\ndtype\n" + node + TUPLE1 + b"R\x90" + STOP


# ----------------------------------------------------------------------------- zip and gzip bombs
def deflate_zeros(total: int, prefix: bytes = b"") -> tuple[bytes, int]:
    """A raw deflate stream of `prefix` then `total` zero bytes, built from one compressed MiB
    repeated (a full flush resets the compressor, so every block compresses alike): ~1 KB per MiB.
    Returns (stream, crc32 of the prefix only; the bombs are refused before any CRC matters)."""
    mib = 1 << 20
    assert total % mib == 0
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = c.compress(prefix) + c.flush(zlib.Z_FULL_FLUSH) if prefix else b""
    block = c.compress(bytes(mib)) + c.flush(zlib.Z_FULL_FLUSH)
    again = c.compress(bytes(mib)) + c.flush(zlib.Z_FULL_FLUSH)
    assert block == again
    return head + block * (total // mib) + c.flush(), zlib.crc32(prefix)


def gzip_bytes(stream: bytes, crc: int, size: int) -> bytes:
    return b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff" + stream + struct.pack("<II", crc, size & 0xFFFFFFFF)


def gzip_bomb(total: int, prefix: bytes = b"") -> bytes:
    return gzip_bytes(*deflate_zeros(total, prefix), len(prefix) + total)


def zip_bytes(members: dict) -> bytes:
    """A zip of {name: (deflate stream, crc, uncompressed size)} written by hand (zipfile cannot
    store a stream it did not compress); sizes under 4 GiB, no zip64."""
    local, central = b"", b""
    for name, (stream, crc, size) in members.items():
        n = name.encode()
        offset = len(local)
        fields = struct.pack("<HHHHHIII", 20, 0, 8, 0, 0x21, crc, len(stream), size)
        local += b"PK\x03\x04" + fields + struct.pack("<HH", len(n), 0) + n + stream
        tail = struct.pack("<HHHHHII", len(n), 0, 0, 0, 0, 0, offset)  # name length .. local header offset
        central += b"PK\x01\x02" + struct.pack("<H", 20) + fields + tail + n
    end = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, len(members), len(members), len(central), len(local), 0)
    return local + central + end


def deflated(data: bytes) -> tuple[bytes, int, int]:
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush(), zlib.crc32(data), len(data)


def sbx_zip(policy_pickle: bytes | None = None, data: bytes | None = None) -> bytes:
    """An SBX-looking model zip whose policy is `policy_pickle` (or whose whole `data` is `data`)."""
    if data is None:
        data = json.dumps({"policy_class": {"__module__": "sbx.dqn.policies"},
                           "policy": {":serialized:": base64.b64encode(policy_pickle).decode()}}).encode()
    return zip_bytes({"data": deflated(data)})


def text(s: str) -> bytes:
    b = s.encode()
    return b"\x8c" + bytes([len(b)]) + b                                   # SHORT_BINUNICODE


def integer(i: int) -> bytes:
    return b"J" + struct.pack("<i", i)                                     # BININT


def mapping(items: dict) -> bytes:
    return b"}(" + b"".join(k + v for k, v in items.items()) + b"u"        # EMPTY_DICT, MARK, ..., SETITEMS


def instance(module: str, name: str, state: bytes) -> bytes:
    """module.name() built with `state`: GLOBAL, EMPTY_TUPLE, NEWOBJ, state, BUILD."""
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n)\x81" + state + b"b"


def float32_dtype() -> bytes:
    """np.dtype("float32") as numpy pickles it: numpy.dtype("f4", False, True), then its state (3, "<", ...)."""
    return (b"cnumpy\ndtype\n" + text("f4") + b"\x89\x88\x87R"
            + b"(K\x03" + text("<") + b"NNN" + integer(-1) + integer(-1) + b"K\x00tb")


def sbx_cnn_policy(shape) -> bytes:
    """An SBX DQN CnnPolicy whose observation space is `shape` (float32) and whose params are empty (each class as
    SBX names it, the sizes of a real policy): what the loader reads before it compares the params with its
    network's."""
    space = instance("gymnasium.spaces.box", "Box", mapping({text("_shape"): b"(" + b"".join(map(integer, shape)) + b"t",
                                                             text("dtype"): float32_dtype()}))
    qf = instance("sbx.dqn.policies", "CnnQNetwork", mapping({text("n_actions"): integer(4), text("n_units"): integer(512),
                                                              text("activation_fn"): b"cjax.nn\nrelu\n"}))
    state = instance("flax.training.train_state", "TrainState", mapping({text("params"): mapping({})}))
    return P4 + instance("sbx.dqn.policies", "DQNPolicy", mapping(
        {text("observation_space"): space, text("qf"): qf, text("qf_state"): state})) + STOP


def npy_header(shape, descr: str) -> bytes:
    h = repr({"descr": descr, "fortran_order": False, "shape": tuple(shape)}).encode()
    h += b" " * (63 - (len(h) + 10) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h


# ----------------------------------------------------------------------------- the catalogue
@dataclass
class Case:
    kind: str              # "sbx" (an --agent file), "dopamine" (an --input folder) or "npz" (actions explained)
    path: Path
    says: str              # what the one error line must contain


GIB = 1 << 30


def _dopamine(d: Path, name: str, file: str, content: bytes) -> Path:
    out = d / name
    shutil.copytree(FIXTURE / "rainbow", out)
    (out / file).write_bytes(content)
    return out


def catalogue(d: Path) -> dict:
    """Write every crafted file under `d` (about 20 MB in all) and return {name: Case}."""
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    sbx = {
        "deep tuple as dict key (10^6 levels)": (as_dict_key(deep_tuple(10 ** 6)), "nested deeper than 1000"),
        "DUP-doubled tuple as dict key": (as_dict_key(doubled_dup(60)), "shared ones"),
        "memo-doubled tuple as set item": (as_set_item(doubled_memo(60)), "shared ones"),
        "doubled tuple as the policy class": (as_called(doubled_dup(60)), "shared ones"),
        "tuple of 2^20 leaves named in a message": (as_called(doubled_dup(20)), "policy class a tuple"),
        "STACK_GLOBAL of a tuple and an int": (stack_global(doubled_dup(10), ZERO), "must be strings"),
    }
    # before: 64 GiB of zeros for the network's shapes (a MemoryError, or the memory taken, before any check)
    sbx["observation space of 4 x 65536 x 65536 float32"] = (sbx_cnn_policy((4, 65536, 65536)), "params do not match")
    cases = {}
    for i, (name, (pkl, says)) in enumerate(sbx.items()):
        p = d / f"sbx{i}.zip"
        p.write_bytes(sbx_zip(pkl))
        cases[name] = Case("sbx", p, says)
    p = d / "zip_bomb.zip"
    p.write_bytes(zip_bytes({"data": deflate_zeros(3 * GIB) + (3 * GIB,)}))
    cases["zip bomb: 3 GiB SBX data"] = Case("sbx", p, "declares 3221225472 bytes")
    p = d / "sb3_bomb.zip"
    p.write_bytes(zip_bytes({"data": deflated(b'{"policy_class": {"__module__": "stable_baselines3"}}'),
                             "policy.pth": deflate_zeros(2 * GIB) + (2 * GIB,)}))
    cases["zip bomb: 2 GiB SB3 policy.pth"] = Case("sbx", p, "declares 2147483648 bytes")
    p = d / "deep_json.zip"
    p.write_bytes(sbx_zip(data=b"[" * 10 ** 6))
    cases["JSON data nested 10^6 deep"] = Case("sbx", p, "nests deeper than JSON can be parsed")
    p = d / "not_json.zip"
    p.write_bytes(sbx_zip(data=b'{"policy_class": \xff'))
    cases["data member not JSON"] = Case("sbx", p, "member is not JSON")

    ends = "episode_end_indices_ckpt.7.gz"
    dop = {
        "episode ends: deep tuple as set item (10^4 levels)": (ends, as_set_item(deep_tuple(10 ** 4)), "nested deeper"),
        "episode ends: deep tuple, 10^6 levels": (ends, as_set_item(deep_tuple(10 ** 6)), "bytes uncompressed"),
        "episode ends: memo-doubled tuple as set item": (ends, as_set_item(doubled_memo(60)), "nested deeper"),
        "episode ends: STACK_GLOBAL of a doubled tuple": (ends, stack_global(doubled_memo(60), ZERO), "nested deeper"),
        "episode ends: STACK_GLOBAL of a tuple": (ends, stack_global(doubled_memo(4), ZERO), "must be strings"),
        "episode ends: doubled tuple as a dtype code": (ends, dtype_of(doubled_memo(60)), "nested deeper"),
    }
    for i, (name, (file, pkl, says)) in enumerate(dop.items()):
        cases[name] = Case("dopamine", _dopamine(d, f"dop{i}", file, zlib.compress(pkl, 9, wbits=31)), says)
    bombs = {
        "gzip bomb: 4 GiB episode ends": (ends, gzip_bomb(4 * GIB), "bytes uncompressed"),
        "terminal file of 2^31 entries for 50 frames": (
            "$store$_terminal_ckpt.7.gz", gzip_bomb(2 * GIB, npy_header((2 ** 31,), "|u1")), "2147483648 entries"),
        "invalid_range of 2^28 entries": (
            "invalid_range_ckpt.7.gz", gzip_bomb(2 * GIB, npy_header((2 ** 28,), "<i8")), "268435456 entries"),
        "observation header of 10^10 frames": (
            "$store$_observation_ckpt.7.gz", gzip_bomb(0, npy_header((10 ** 10, 10, 10), "|u1")), "10000000000 frames"),
        "observation header of 10^6 frames in a tiny file": (
            "$store$_observation_ckpt.7.gz", gzip_bomb(0, npy_header((10 ** 6, 10, 10), "|u1")), "can hold"),
    }
    for i, (name, (file, content, says)) in enumerate(bombs.items()):
        cases[name] = Case("dopamine", _dopamine(d, f"bomb{i}", file, content), says)
    obs = deflated(npy_header((2, 10, 10, 4), "|u1") + bytes(800))
    p = d / "actions_bomb.npz"
    p.write_bytes(zip_bytes({"obs.npy": obs, "actions.npy": deflate_zeros(2 * GIB, npy_header((2 ** 28,), "<i8"))
                             + (2 * GIB + 128,)}))
    cases["npz actions of 2^28 entries for 2 frames"] = Case("npz", p, "has shape (268435456,)")
    p = d / "actions_wrap.npz"  # before: cast to int32, 2**32 + 1 became action 1 and was explained (exit 0)
    np.savez(p, obs=np.zeros((2, 10, 10, 4), np.uint8), actions=np.array([0, 2 ** 32 + 1], np.int64))
    cases["npz action 2^32 + 1, which int32 wraps onto action 1"] = Case("npz", p, "holds action 4294967297")
    (d / "agent.py").write_text(AGENT_PY)
    np.save(d / "obs.npy", np.zeros((2, 10, 10, 4), np.uint8))
    return cases


def cli_argv(case: Case, d: Path, out: Path) -> list:
    d = Path(d)
    if case.kind == "sbx":
        return ["explain", "--agent", str(case.path), "--input", str(d / "obs.npy"), "--methods", "gradient",
                "--out", str(out), "--quiet"]
    return ["explain", "--agent", f"{d / 'agent.py'}:load", "--input", str(case.path), "--methods", "gradient",
            "--out", str(out), "--quiet"] + (["--target", "q_action"] if case.kind == "npz" else [])


def _run(d: Path, names: list):
    """Each case through its Python loader and through `jaxsal explain` (in this process): one JSON line each."""
    import contextlib
    import io

    from jaxsal.cli import main
    from jaxsal.errors import SaliencyInputError
    from jaxsal.io import open_source
    from jaxsal.loaders import load_file

    cases = {n: c for n, c in catalogue_index(d).items() if n in names}
    for i, (name, case) in enumerate(cases.items()):
        t = time.perf_counter()
        try:
            if case.kind == "sbx":
                load_file(case.path)
            else:
                src = open_source(case.path)
                if case.kind == "npz":
                    src.actions(0, 1)
            loader = "accepted"
        except SaliencyInputError as e:
            loader = str(e)
        loader_s = time.perf_counter() - t
        out = d / "out" / str(i)
        err = io.StringIO()
        t = time.perf_counter()
        with contextlib.redirect_stderr(err):
            code = main(cli_argv(case, d, out))
        print(json.dumps({"name": name, "loader": loader[:2000], "loader_s": loader_s, "code": code,
                          "stderr": err.getvalue()[:2000], "cli_s": time.perf_counter() - t,
                          "written": out.exists(),
                          "maxrss_mib": _peak_rss_mib()}), flush=True)


def _peak_rss_mib() -> float:
    """This process's own peak resident set (VmHWM): getrusage's ru_maxrss also counts the parent's
    resident set at the fork before exec (a test worker's gigabytes), which says nothing of this run."""
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) / 1024


def catalogue_index(d: Path) -> dict:
    """The catalogue's cases without writing anything (the paths `catalogue(d)` wrote)."""
    return json_cases(json.loads((Path(d) / "cases.json").read_text()))


def json_cases(raw: dict) -> dict:
    return {n: Case(c["kind"], Path(c["path"]), c["says"]) for n, c in raw.items()}


def write_catalogue(d: Path) -> dict:
    cases = catalogue(d)
    (Path(d) / "cases.json").write_text(json.dumps({n: {"kind": c.kind, "path": str(c.path), "says": c.says}
                                                    for n, c in cases.items()}))
    return cases


if __name__ == "__main__":
    _run(Path(sys.argv[1]), sys.argv[2:])
