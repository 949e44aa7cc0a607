"""Input readers: .npy/.npz/shards/Dopamine read in chunks equal the data; bad files -> one clear error."""
import gzip

import numpy as np
import pytest

from jaxsal.errors import SaliencyInputError
from jaxsal.io import open_source


def _stacks(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, 84, 84, 4), dtype=np.uint8)


def _read_chunked(src, sizes):
    out, start, k = [], 0, 0
    while start < len(src):
        stop = min(len(src), start + sizes[k % len(sizes)])
        out.append(src.read(start, stop))
        start, k = stop, k + 1
    return np.concatenate(out)


def test_npy_chunked_and_random_access(tmp_path):
    x = _stacks(23)
    np.save(tmp_path / "a.npy", x)
    src = open_source(tmp_path / "a.npy")
    assert len(src) == 23 and src.shape == (23, 84, 84, 4)
    np.testing.assert_array_equal(_read_chunked(src, [5, 1, 7]), x)
    np.testing.assert_array_equal(src.read(17, 20), x[17:20])
    np.testing.assert_array_equal(src.read(2, 3), x[2:3])


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_npz_stored_and_deflated(tmp_path, save):
    x = _stacks(19, seed=1)
    save(tmp_path / "b.npz", obs=x, actions=np.arange(19))
    src = open_source(tmp_path / "b.npz")
    assert src.shape == x.shape
    np.testing.assert_array_equal(_read_chunked(src, [4, 6]), x)
    np.testing.assert_array_equal(src.read(3, 9), x[3:9])  # backwards: reopens the member
    np.testing.assert_array_equal(src.read(15, 19), x[15:19])


def test_shard_directory_in_name_order(tmp_path):
    a, b, c = _stacks(5, 2), _stacks(7, 3), _stacks(3, 4)
    d = tmp_path / "shards"
    d.mkdir()
    np.save(d / "part0.npy", a)
    np.savez_compressed(d / "part1.npz", obs=b)
    np.save(d / "part2.npy", c)
    (d / "README.txt").write_text("ignored")
    src = open_source(d)
    full = np.concatenate([a, b, c])
    assert len(src) == 15
    np.testing.assert_array_equal(_read_chunked(src, [4]), full)
    np.testing.assert_array_equal(src.read(3, 14), full[3:14])


# --------------------------------------------------------------------------- Dopamine layout
def _gz_save(path, arr):
    """Exactly how Dopamine's OutOfGraphReplayBuffer.save writes each array."""
    with open(path, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb") as out:
        np.save(out, arr, allow_pickle=False)


def write_dopamine(d, k, frames, terminal, actions=None, add_count=None, horizon=1, counters=True):
    """A hand-made imitation of Dopamine checkpoint K (tests/_support/dopamine_buffers.py writes real ones):
    `frames` is the whole circular buffer, `add_count` (default len(frames): just full) the write
    counter, saved with the invalid_range Dopamine writes for it (update horizon `horizon`); with
    counters=False neither file."""
    d.mkdir(parents=True, exist_ok=True)
    _gz_save(d / f"$store$_observation_ckpt.{k}.gz", frames)
    _gz_save(d / f"$store$_terminal_ckpt.{k}.gz", terminal.astype(np.uint8))
    _gz_save(d / f"$store$_action_ckpt.{k}.gz",
             np.zeros(len(frames), np.int32) if actions is None else actions.astype(np.int32))
    _gz_save(d / f"$store$_reward_ckpt.{k}.gz", np.zeros(len(frames), np.float32))
    if counters:
        cap = len(frames)
        add_count = cap if add_count is None else add_count
        _gz_save(d / f"add_count_ckpt.{k}.gz", np.array(add_count, np.int64))
        _gz_save(d / f"invalid_range_ckpt.{k}.gz",
                 np.array([(add_count % cap - horizon + j) % cap for j in range(4 + horizon)], np.int64))


def dopamine_reference(frames, terminal, add_count=None, horizon=1, episode_ends=()):
    """(indices, states) Dopamine serves from such a checkpoint: its is_valid_transition, line by
    line, over the indices oldest first, and get_observation_stack of each (raw frames i-3..i)."""
    cap = len(frames)
    add_count = cap if add_count is None else add_count
    cursor, full = add_count % cap, add_count >= cap
    invalid = {(cursor - horizon + j) % cap for j in range(4 + horizon)}

    def valid(i):
        if not full and (i >= cursor - horizon or i < 3):
            return False
        if i in invalid:
            return False
        if any(terminal[(i - b) % cap] for b in (3, 2, 1)):
            return False
        return not any(j % cap in episode_ends and not terminal[j % cap] for j in range(i, i + horizon))

    order = [(cursor + p) % cap for p in range(cap)] if full else range(cap)
    idx = np.array([i for i in order if valid(i)], np.int64)
    states = np.stack([np.moveaxis(frames[[(i - 3 + t) % cap for t in range(4)]], 0, -1) for i in idx])
    return idx, states


def test_dopamine_checkpoints_match_reference(tmp_path):
    rng = np.random.default_rng(5)
    f0 = rng.integers(1, 256, (30, 84, 84), dtype=np.uint8)
    t0 = np.zeros(30, bool)
    t0[[6, 7, 15, 29]] = True  # includes a one-step episode (7) and a terminal at the end
    f1 = rng.integers(1, 256, (11, 84, 84), dtype=np.uint8)
    t1 = np.zeros(11, bool)
    t1[2] = True
    d = tmp_path / "replay_logs"
    write_dopamine(d, 0, f0, t0, add_count=41)  # wrapped: cursor 11
    write_dopamine(d, 10, f1, t1, add_count=10, horizon=3)  # K sorted numerically: 0 before 10
    write_dopamine(d, 2, f1[1:], np.zeros(10, bool), add_count=7)  # slots 7..9 never written
    refs = [dopamine_reference(f0, t0, 41), dopamine_reference(f1[1:], np.zeros(10, bool), 7),
            dopamine_reference(f1, t1, 10, horizon=3)]
    want = np.concatenate([r[1] for r in refs])
    src = open_source(d)
    assert src.shape == (len(want), 84, 84, 4)
    assert list(refs[1][0]) == [3, 4, 5] and list(refs[2][0]) == [6]  # the terminal at 2 ends 3..5
    for sizes in ([1], [5, 3], [7], [len(want)]):
        np.testing.assert_array_equal(_read_chunked(open_source(d), sizes), want)
    ids = src.row_ids(0, len(src))
    np.testing.assert_array_equal(ids["index"], np.concatenate([r[0] for r in refs]))
    np.testing.assert_array_equal(ids["checkpoint"], np.repeat([0, 2, 10], [len(r[0]) for r in refs]))
    assert refs[0][0][0] == 15 and 11 not in refs[0][0]  # the oldest stack after the cursor; none across it
    np.testing.assert_array_equal(src.read(2, 12), want[2:12])  # backwards seek restarts the stream


def test_fingerprint_changes_with_content(tmp_path):
    x = _stacks(4)
    np.save(tmp_path / "a.npy", x)
    f1 = open_source(tmp_path / "a.npy").fingerprint()
    assert open_source(tmp_path / "a.npy").fingerprint() == f1
    x[2, 5, 5, 1] ^= 1
    np.save(tmp_path / "a.npy", x)
    assert open_source(tmp_path / "a.npy").fingerprint() != f1


# --------------------------------------------------------------------------- bad input
def _bad_cases(tmp):
    np.save(tmp / "flat.npy", np.zeros((3, 84, 84), np.uint8))
    np.save(tmp / "empty.npy", np.zeros((0, 84, 84, 4), np.uint8))
    np.save(tmp / "strings.npy", np.array([["a"] * 4] * 2).reshape(2, 1, 1, 4))
    (tmp / "garbage.npy").write_bytes(b"not a numpy file at all")
    (tmp / "garbage.npz").write_bytes(b"PK\x03\x04 broken zip")
    np.savez(tmp / "nokey.npz", frames=np.zeros((2, 84, 84, 4), np.uint8))
    np.save(tmp / "trunc.npy", _stacks(4))
    data = (tmp / "trunc.npy").read_bytes()
    (tmp / "trunc.npy").write_bytes(data[: len(data) // 2])
    (tmp / "emptydir").mkdir()
    (tmp / "frames.txt").write_text("1 2 3")
    d0 = tmp / "dop_nocounters"
    write_dopamine(d0, 0, np.zeros((9, 84, 84), np.uint8), np.zeros(9), counters=False)
    d = tmp / "dop_corrupt"
    write_dopamine(d, 0, np.zeros((5, 84, 84), np.uint8), np.zeros(5))
    (d / "$store$_observation_ckpt.0.gz").write_bytes(b"\x1f\x8b garbage")
    d2 = tmp / "dop_noterm"
    write_dopamine(d2, 0, np.zeros((5, 84, 84), np.uint8), np.zeros(5))
    (d2 / "$store$_terminal_ckpt.0.gz").unlink()
    d3 = tmp / "dop_len"
    write_dopamine(d3, 0, np.zeros((5, 84, 84), np.uint8), np.zeros(4))
    d4 = tmp / "dop_rgb"
    write_dopamine(d4, 0, np.zeros((5, 84, 84, 3), np.uint8), np.zeros(5))
    return {"missing": (tmp / "nope.npy", "does not exist"), "flat": (tmp / "flat.npy", "(N, 84, 84, 4)"),
            "empty": (tmp / "empty.npy", "holds no states"), "strings": (tmp / "strings.npy", "dtype"),
            "garbage_npy": (tmp / "garbage.npy", "not a valid .npy"),
            "garbage_npz": (tmp / "garbage.npz", "not a valid .npz"), "nokey": (tmp / "nokey.npz", "'obs'"),
            "truncated": (tmp / "trunc.npy", "truncated"), "emptydir": (tmp / "emptydir", "no .npy/.npz"),
            "suffix": (tmp / "frames.txt", "unsupported"), "dop_corrupt": (d, "gzip"),
            "dop_noterm": (d2, "missing Dopamine file"), "dop_len": (d3, "entries"),
            "dop_rgb": (d4, "(N, 84, 84)"), "dop_nocounters": (d0, "has no add_count_ckpt.0.gz and no "
                                                                    "invalid_range_ckpt.0.gz")}


def test_bad_inputs_one_clear_error(tmp_path):
    for name, (path, fragment) in _bad_cases(tmp_path).items():
        with pytest.raises(SaliencyInputError) as e:
            src = open_source(path)
            src.read(0, len(src))
        assert fragment in str(e.value), (name, str(e.value))
        assert "\n" not in str(e.value), name



def test_big_endian_frames_and_a_negative_header_shape_are_one_clear_error(tmp_path):
    """A big-endian .npy (JAX takes native byte order only: a TypeError deep in the job before) and a
    crafted header with a negative dimension (a ValueError from len()) are refused when opened."""
    from tests._support.crafted_files import npy_header

    np.save(tmp_path / "be.npy", _stacks(2).astype(">f4"))
    with pytest.raises(SaliencyInputError, match="byte order.*newbyteorder"):
        open_source(tmp_path / "be.npy")
    (tmp_path / "neg.npy").write_bytes(npy_header((-5, 84, 84, 4), "|u1") + bytes(100))
    with pytest.raises(SaliencyInputError, match="negative shape"):
        open_source(tmp_path / "neg.npy")

def test_truncated_gzip_stream(tmp_path):
    d = tmp_path / "dop"
    write_dopamine(d, 0, np.random.default_rng(0).integers(0, 255, (40, 84, 84), dtype=np.uint8), np.zeros(40))
    p = d / "$store$_observation_ckpt.0.gz"
    p.write_bytes(p.read_bytes()[:-20000])
    src = open_source(d)
    with pytest.raises(SaliencyInputError, match="truncated|corrupt"):
        src.read(0, len(src))

