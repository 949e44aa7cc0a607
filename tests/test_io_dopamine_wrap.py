"""Dopamine circular buffers: add_count and invalid_range give chronological states that never
stack across the write cursor or an episode end; the buffer's actions come out aligned."""
import gzip

import numpy as np
import pytest

from jaxsal.errors import SaliencyInputError
from jaxsal.io import open_source
from tests.test_io_readers import reference_stack, write_dopamine

CAP, ADDS, HORIZON = 20, 47, 1


def _gz(path, a):
    with gzip.open(path, "wb") as f:
        np.save(f, a, allow_pickle=False)


def _wrapped_buffer(d, adds=ADDS):
    """Step s (s < adds) lives at physical index s % CAP, frame filled with s + 1, action s % 4."""
    steps = np.arange(adds)
    last = {s % CAP: s for s in steps}  # the step that wrote each slot last
    phys_step = np.array([last.get(i, -1) for i in range(CAP)])
    frames = np.zeros((CAP, 84, 84), np.uint8)
    terminal_steps = {33, 40}
    term = np.zeros(CAP, bool)
    actions = np.zeros(CAP, np.int32)
    for i, s in enumerate(phys_step):
        if s >= 0:
            frames[i] = s + 1
            term[i] = s in terminal_steps
            actions[i] = s % 4
    write_dopamine(d, 3, frames, term, actions)
    cursor = adds % CAP if adds >= CAP else adds
    _gz(d / "add_count_ckpt.3.gz", np.array(adds, np.int64))
    _gz(d / "invalid_range_ckpt.3.gz",
        np.array([(cursor - HORIZON + i) % CAP for i in range(4 + HORIZON)], np.int64))
    return terminal_steps


def _expected(adds, terminal_steps, first, last):
    steps = np.arange(adds - CAP if adds >= CAP else 0, adds)
    frames = np.stack([np.full((84, 84), s + 1, np.uint8) for s in steps])
    term = np.array([s in terminal_steps for s in steps])
    ref = reference_stack(frames, term)
    keep = (steps >= first) & (steps <= last)
    return ref[keep], steps[keep]


@pytest.mark.parametrize("sizes", [[15], [4, 4, 4, 3], [1] * 15])
def test_wrapped_buffer_is_chronological_and_never_crosses_the_cursor(tmp_path, sizes):
    terminal_steps = _wrapped_buffer(tmp_path)
    src = open_source(tmp_path)
    # oldest kept step 27 = cursor 7; invalid physical 6..10 = steps 46 (newest) and 27..30
    want, steps = _expected(ADDS, terminal_steps, 31, 45)
    assert src.shape == (15, 84, 84, 4)
    got, at = [], 0
    for n in sizes:
        got.append(src.read(at, at + n))
        at += n
    got = np.concatenate(got)
    np.testing.assert_array_equal(got, want)
    newest = got[..., 3][:, 0, 0].astype(int) - 1
    assert (np.diff(newest) == 1).all() and newest[0] == 31  # chronological, no newest/oldest mix
    assert (got[list(steps).index(34)][..., :3] == 0).all()  # first state after the terminal at 33
    np.testing.assert_array_equal(src.actions(0, 15), steps % 4)


def test_unwrapped_buffer_drops_unwritten_slots_and_invalid_range(tmp_path):
    terminal_steps = _wrapped_buffer(tmp_path, adds=12)  # slots 12..19 never written
    src = open_source(tmp_path)
    want, steps = _expected(12, terminal_steps, 0, 10)  # invalid: 11 (horizon) and 12..15 (unwritten)
    np.testing.assert_array_equal(src.read(0, len(src)), want)
    np.testing.assert_array_equal(src.actions(0, len(src)), steps % 4)


def test_missing_actions_for_q_action_is_one_clear_error(tmp_path):
    _wrapped_buffer(tmp_path)
    (tmp_path / "$store$_action_ckpt.3.gz").unlink()
    with pytest.raises(SaliencyInputError, match="q_action"):
        open_source(tmp_path).actions(0, 2)
