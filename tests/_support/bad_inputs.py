"""The bad inputs of `jaxsal explain`: files that must be refused, and the cases that run them.

Used by tests/cli/test_bad_input.py (each is one line, exit 2, nothing written) and
tests/docs/test_troubleshooting.py (the page explains each message); the `bad_inputs` fixture
(tests/conftest.py) writes them once per module. The cases of WHEEL run as in a wheel's install
(only the demo agent's weights): `run` runs every case as it needs."""
import contextlib

import numpy as np

from tests._support import crafted_files as crafted
from tests._support import foreign_agents as F
from tests._support import wheel_install as wheel
from tests._support.cli_support import corrupt_member, frames, make_agent_files

NCHW_AGENT = '''
import jax
from tests._support import crafted_files as crafted
from tests._support import foreign_agents as F


def load():   # CleanRL's QNetwork: channel-first input, layout not declared
    q = F.QNetwork(action_dim=4)
    return q.apply, q.init(jax.random.PRNGKey(0), F.atari_nchw(1))
'''


def write(d):
    """Write every bad input (and two good agents) under the folder d; returns (d, card, atari)."""
    card = make_agent_files(d / "agent")
    atari = make_agent_files(d / "atari", num_actions=4, game="breakout")
    (d / "nchw_agent.py").write_text(NCHW_AGENT)
    (d / "train.py").write_text("import sys\nsys.exit('train.py: run it with --env and --steps')\n\n\ndef load():\n"
                                "    pass\n")   # a training script that exits when imported
    np.save(d / "ok.npy", frames(6))
    nan = frames(6).astype(np.float32)
    nan[3, 0, 0, 0] = np.nan                  # second chunk of 2: the first is fine
    np.save(d / "nan.npy", nan)
    inf = frames(6).astype(np.float32)
    inf[0, 1, 1, 1] = np.inf
    np.save(d / "inf.npy", inf)
    np.save(d / "unit.npy", frames(3, size=84).astype(np.float32) / 255.0)
    np.save(d / "complex.npy", frames(3).astype(np.complex64))
    np.save(d / "longdouble.npy", frames(3).astype(np.longdouble))   # float128: no JAX array type
    np.save(d / "empty.npy", np.zeros((0, 10, 10, 4), np.uint8))
    np.save(d / "cut.npy", frames(6))                         # a copy cut off in frame 5
    (d / "cut.npy").write_bytes((d / "cut.npy").read_bytes()[:-300])
    (d / "appended.npy").write_bytes(crafted.npy_header((6, 10, 10, 4), "|u1") + frames(8).tobytes())
    np.save(d / "nchw.npy", F.atari_nchw(3))
    np.save(d / "nhwc84.npy", F.atari_nchw(3).transpose(0, 2, 3, 1))
    np.savez_compressed(d / "deflated.npz", obs=frames(48))   # 64 corrupt bytes a third into the member
    corrupt_member(d / "deflated.npz", nbytes=64, at=0.3)
    np.savez(d / "stored.npz", obs=frames(48))                # 200 flipped bytes in frame 4
    corrupt_member(d / "stored.npz", nbytes=200, at=0.1)
    (d / "shards").mkdir()
    for k in range(3):
        np.savez(d / "shards" / f"part{k}.npz", obs=frames(4, seed=k))
    corrupt_member(d / "shards" / "part2.npz", nbytes=50, at=0.5)
    (d / "unit_shard").mkdir()
    np.save(d / "unit_shard" / "a.npy", frames(4, size=84))
    np.save(d / "unit_shard" / "b.npy", frames(4, seed=1, size=84).astype(np.float32) / 255.0)
    (d / "looped_shards").mkdir()
    np.save(d / "looped_shards" / "a.npy", frames(4))
    (d / "looped_shards" / "b.npy").symlink_to(".", target_is_directory=True)   # a link to its own folder
    (d / "zip_bomb.zip").write_bytes(crafted.zip_bytes({"data": crafted.deflate_zeros(1 << 30) + (1 << 30,)}))
    (d / "deep.zip").write_bytes(crafted.sbx_zip(crafted.as_dict_key(crafted.deep_tuple(10 ** 6))))
    crafted._dopamine(d, "gzip_bomb", "episode_end_indices_ckpt.7.gz", crafted.gzip_bomb(1 << 30))
    wheel.make(d / "wheel")
    return d, card, atari


NOT_INSTALLED = "minatar-breakout"
"""A shipped agent whose weights a wheel's install lacks."""

WHEEL = {"shipped agent without its weights"}
"""The cases that run as in a wheel's install."""


def run(d, name, argv) -> int:
    """`jaxsal argv` of case `name` (in-process), inside a wheel's install for the cases of WHEEL."""
    from jaxsal.cli import main

    with wheel.installed_as_wheel(d / "wheel") if name in WHEEL else contextlib.nullcontext():
        return main(argv)


def cases(d, card, atari):
    """name -> (argv without --out, what the error names, the fix it names)."""
    base = ["explain", "--agent", str(card), "--methods", "standin_grad", "--quiet"]
    ok = ["--input", str(d / "ok.npy")]
    nchw = ["explain", "--agent", f"{d / 'nchw_agent.py'}:load", "--methods", "gradient", "--quiet"]
    return {
        "batch size 0": (base + ok + ["--batch-size", "0"], "--batch-size", "integer >= 1"),
        "chunk 0": (base + ok + ["--chunk", "0"], "--chunk", "integer >= 1"),
        "limit 0": (base + ok + ["--limit", "0"], "--limit", "integer >= 1"),
        # before: exit 1, "internal error OverflowError: Python int too large to convert to C long" (PRNGKey)
        "seed beyond 64 bits": (base + ok + ["--seed", str(2 ** 70)], "--seed", "from -2**63 to 2**63-1"),
        "NaN frames": (base + ["--input", str(d / "nan.npy"), "--chunk", "2"], "frame 3", "nan_to_num"),
        "inf frames": (base + ["--input", str(d / "inf.npy")], "NaN or inf", "nan_to_num"),
        "frames in [0, 1]": (["explain", "--agent", str(atari), "--methods", "gradient", "--quiet",
                              "--input", str(d / "unit.npy")], "[0, 1]", "* 255"),
        "complex frames": (base + ["--input", str(d / "complex.npy")], "dtype complex64", "uint8"),
        # before: exit 1, "internal error TypeError: Dtype float128 is not a valid JAX array type"
        "float128 frames": (base + ["--input", str(d / "longdouble.npy")], "dtype float128", "uint8"),
        "no states": (base + ["--input", str(d / "empty.npy")], "holds no states", "at least one frame stack"),
        "truncated frames file": (base + ["--input", str(d / "cut.npy")], "file is truncated",
                                  "header says 6 frames"),
        "frames appended after the header": (base + ["--input", str(d / "appended.npy")],
                                             "800 bytes after the 6 frames its header declares", "np.save"),
        "unknown layer": (base[:4] + ["gradcam", "--quiet", "--option", "gradcam.layer=nosuch"] + ok,
                          "unknown layer 'nosuch'", "available layers: ['conv1'"),
        "layer of another method's name": (base[:4] + ["gradcam", "--quiet", "--option", "gradcam.layer=q"] + ok,
                                           "layer 'q'", "Spatial layers"),
        "value target on a Q-network": (base + ok + ["--target", "value"], "target='value'", "another --target"),
        "bad option value (in the method)": (base[:4] + ["standin_noise", "--quiet", "--option",
                                                         "standin_noise.n_masks=0"] + ok, "n_masks", ">= 1"),
        "channel-first model, NCHW buffer": (nchw + ["--input", str(d / "nchw.npy")], "channel-first",
                                             "--layout NCHW"),
        "channel-first model, NHWC buffer": (nchw + ["--input", str(d / "nhwc84.npy")], "channel-first",
                                             "--layout NCHW"),
        "channel-last model, --layout NCHW": (base + ok + ["--layout", "NCHW"], "channel-last", "--layout NHWC"),
        "corrupt deflated member": (base + ["--input", str(d / "deflated.npz")], "'obs.npy' is corrupt",
                                    "download the file again"),
        "corrupt deflated member, --limit": (base + ["--input", str(d / "deflated.npz"), "--limit", "8"],
                                             "'obs.npy' is corrupt", "download the file again"),
        "corrupt stored member": (base + ["--input", str(d / "stored.npz")], "Bad CRC-32", "download the file again"),
        "corrupt stored member, --limit": (base + ["--input", str(d / "stored.npz"), "--limit", "8"], "Bad CRC-32",
                                           "download the file again"),
        "corrupt shard among good ones": (base + ["--input", str(d / "shards"), "--chunk", "4"], "part2.npz",
                                          "download the file again"),
        "a float [0, 1] shard after a uint8 one": (["explain", "--agent", str(atari), "--methods", "gradient",
                                                    "--quiet", "--input", str(d / "unit_shard"), "--chunk", "4"],
                                                   "frames 4:8", "* 255"),
        # before: read as a nested shard folder, looping until ELOOP: the path repeated ~40 times in one message
        "a folder named like a shard": (base + ["--input", str(d / "looped_shards")], "b.npy is a folder",
                                        "move or rename it"),
        "zip bomb as the agent": (["explain", "--agent", str(d / "zip_bomb.zip")] + base[3:] + ok,
                                  "declares 1073741824 bytes", "corrupt or crafted"),
        "pickle nested 10^6 deep in an SBX zip": (["explain", "--agent", str(d / "deep.zip")] + base[3:] + ok,
                                                  "nested deeper than 1000", "do not unpickle it"),
        "gzip bomb in a Dopamine folder": (base + ["--input", str(d / "gzip_bomb")], "bytes uncompressed",
                                           "corrupt or crafted"),
        # before: the SystemExit ended jaxsal with the script's message (argparse's usage), exit 1 or 2
        "a training script that exits when imported": (["explain", "--agent", f"{d / 'train.py'}:load"] + base[3:] + ok,
                                                       "called sys.exit('train.py: run it", "if __name__ =="),
        "shipped agent without its weights": (["explain", "--agent", NOT_INSTALLED] + base[3:] + ok, "not installed",
                                              f"jaxsal agents fetch {NOT_INSTALLED} --from DIR_OR_URL"),
    }
