"""Dopamine circular buffers (hand-made imitations; tests/io/test_dopamine_real.py reads buffers
Dopamine wrote): add_count and invalid_range give Dopamine's valid states oldest first, none
across the write cursor or an episode end, each with its buffer index and action."""
import numpy as np
import pytest

from jaxsal.errors import SaliencyInputError
from jaxsal.io import open_source
from tests.io.test_readers import dopamine_reference, write_dopamine

CAP, ADDS = 20, 47
TERMINAL_STEPS = {33, 40}


def _wrapped_buffer(d, adds=ADDS, horizon=1):
    """Step s (s < adds) lives at physical index s % CAP, frame filled with s + 1, action s % 4."""
    last = {s % CAP: s for s in range(adds)}  # the step that wrote each slot last
    phys_step = np.array([last.get(i, -1) for i in range(CAP)])
    frames = np.zeros((CAP, 84, 84), np.uint8)
    term = np.zeros(CAP, bool)
    actions = np.zeros(CAP, np.int32)
    for i, s in enumerate(phys_step):
        if s >= 0:
            frames[i] = s + 1
            term[i] = s in TERMINAL_STEPS
            actions[i] = s % 4
    write_dopamine(d, 3, frames, term, actions, add_count=adds, horizon=horizon)
    return frames, term, phys_step


@pytest.mark.parametrize("sizes", [[9], [4, 4, 1], [1] * 9])
def test_wrapped_buffer_is_chronological_and_never_crosses_the_cursor(tmp_path, sizes):
    frames, term, phys_step = _wrapped_buffer(tmp_path)
    src = open_source(tmp_path)
    idx, want = dopamine_reference(frames, term, ADDS)
    # oldest kept step 27 = cursor 7; invalid physical 6..10 = steps 46 (newest) and 27..30; the
    # terminals at 33 and 40 end the stacks of 34..36 and 41..43
    steps = phys_step[idx]
    assert list(steps) == [31, 32, 33, 37, 38, 39, 40, 44, 45]
    assert src.shape == (9, 84, 84, 4)
    got, at = [], 0
    for n in sizes:
        got.append(src.read(at, at + n))
        at += n
    got = np.concatenate(got)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got[..., 3][:, 0, 0].astype(int) - 1, steps)  # newest frame of each stack
    np.testing.assert_array_equal(got[..., 0][:, 0, 0].astype(int) - 1, steps - 3)  # no newest/oldest mix
    np.testing.assert_array_equal(src.row_ids(0, 9)["index"], idx)
    np.testing.assert_array_equal(src.actions(0, 9), steps % 4)


def test_unwritten_slots_and_the_update_horizon_are_skipped(tmp_path):
    frames, term, phys_step = _wrapped_buffer(tmp_path, adds=12, horizon=3)  # slots 12..19 never written
    src = open_source(tmp_path)
    idx, want = dopamine_reference(frames, term, 12, horizon=3)
    assert list(idx) == [3, 4, 5, 6, 7, 8]  # 0..2: before the first full stack; 9..11: n-step target unwritten
    np.testing.assert_array_equal(src.read(0, len(src)), want)
    np.testing.assert_array_equal(src.actions(0, len(src)), phys_step[idx] % 4)


def test_missing_actions_for_q_action_is_one_clear_error(tmp_path):
    _wrapped_buffer(tmp_path)
    (tmp_path / "$store$_action_ckpt.3.gz").unlink()
    with pytest.raises(SaliencyInputError, match="q_action"):
        open_source(tmp_path).actions(0, 2)


@pytest.mark.parametrize("actions, says", [
    (np.full(CAP, 2 ** 40), "whole numbers"),         # before: wrapped to action 0 in the int32 cast, silently
    (np.full(CAP, 1.5), "whole numbers"),             # before: truncated to action 1, silently
    (np.zeros((CAP // 2, 2), np.int32), r"shape \(10, 2\)"),  # before: flattened into one action per frame
])
def test_actions_that_are_no_action_indices_are_one_clear_error(tmp_path, actions, says):
    from tests.io.test_readers import _gz_save

    _wrapped_buffer(tmp_path)
    _gz_save(tmp_path / "$store$_action_ckpt.3.gz", actions)
    with pytest.raises(SaliencyInputError, match=says):
        open_source(tmp_path).actions(0, 2)


def test_a_checkpoint_number_beyond_int64_is_one_clear_error(tmp_path):
    """Before: OverflowError when the states' checkpoint numbers were stored."""
    frames = np.zeros((CAP, 84, 84), np.uint8)
    write_dopamine(tmp_path, 3, frames, np.zeros(CAP, bool))
    for p in tmp_path.iterdir():
        p.rename(tmp_path / p.name.replace(".3.gz", f".{2 ** 64}.gz"))
    with pytest.raises(SaliencyInputError, match="beyond int64"):
        open_source(tmp_path).row_ids(0, 2)


@pytest.mark.parametrize("flags", [np.full(CAP, np.nan), np.full(CAP, 7, np.uint8), np.full(CAP, -1.0)])
def test_terminal_flags_other_than_0_or_1_are_one_clear_error(tmp_path, flags):
    """Dopamine writes uint8 0/1; before, NaN, 7 or -1 read as True (every stack cut, 'no state Dopamine
    would sample' later, naming no file)."""
    from tests.io.test_readers import _gz_save

    _wrapped_buffer(tmp_path)
    _gz_save(tmp_path / "$store$_terminal_ckpt.3.gz", flags)
    with pytest.raises(SaliencyInputError, match=r"terminal_ckpt\.3\.gz: expected terminal flags of 0 or 1"):
        open_source(tmp_path).row_ids(0, 2)


@pytest.mark.parametrize("shape", [(CAP, 0, 84), (CAP, 84, 0)])
def test_frames_with_no_pixels_are_one_clear_error(tmp_path, shape):
    """Before: a checkpoint of 0-wide frames opened, its states (N, 84, 0, 4)."""
    write_dopamine(tmp_path, 3, np.zeros(shape, np.uint8), np.zeros(CAP, bool))
    with pytest.raises(SaliencyInputError, match="expected single frames with shape"):
        open_source(tmp_path).row_ids(0, 2)


def test_unwritten_slots_may_hold_any_bytes(tmp_path):
    """Dopamine's store is np.empty: slots a buffer that is not yet full never wrote keep whatever bytes
    were there (its own checkpoints show terminals of 32..119 and actions of 681956080 there). They are
    never served, so they are not judged."""
    from tests.io.test_readers import _gz_save

    frames, term, phys_step = _wrapped_buffer(tmp_path, adds=12)
    before = open_source(tmp_path)
    want = before.read(0, len(before))
    actions = (phys_step % 4).astype(np.int32)
    actions[12:] = -681956080
    flags = term.astype(np.uint8)
    flags[12:] = 119
    _gz_save(tmp_path / "$store$_action_ckpt.3.gz", actions)
    _gz_save(tmp_path / "$store$_terminal_ckpt.3.gz", flags)
    src = open_source(tmp_path)
    np.testing.assert_array_equal(src.read(0, len(src)), want)
    np.testing.assert_array_equal(src.actions(0, len(src)), phys_step[src.row_ids(0, len(src))["index"]] % 4)
