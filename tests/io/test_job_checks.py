"""`jaxsal.io.run_job`, called from Python, runs the library's checks (jaxsal.checks) once before it
writes anything: the model on these frames, the target, the actions q_action explains, the frames'
values; above job.SCAN_BYTES later chunks are checked as they are read, before their outputs exist."""
import numpy as np
import pytest

from jaxsal.errors import SaliencyInputError
from jaxsal.io import MethodSpec, job, open_source, run_job
from tests._support.conformance import MODEL, PARAMS, _obs


def _nchw(p, x):  # a channel-first model
    return MODEL.apply(p, x.transpose(0, 2, 3, 1))


def _run(tmp_path, obs, apply_fn=MODEL.apply, actions=None, **kw):
    path = tmp_path / "in.npz"
    np.savez(path, obs=obs, actions=np.zeros(len(obs), np.int64) if actions is None else actions)
    out = tmp_path / "out"
    summary = run_job(apply_fn, PARAMS, open_source(path), out, [MethodSpec("gradient", "gradient", {})],
                      quiet=True, chunk=2, **kw)
    return out, summary


def _nan_at(k):
    x = np.asarray(_obs(6), np.float32)
    x[k, 1, 2, 0] = np.nan
    return x


CASES = {
    "q_action actions out of range": (dict(target="q_action", actions=np.array([0, 1, 9])),
                                      "actions do not fit this model"),
    "a target the model cannot give": (dict(target="value"), "needs a value output"),
    "a model of the other layout": (dict(apply_fn=_nchw, layout="NHWC"), "pass layout='NCHW'"),
    "NaN in a later chunk": (dict(obs=_nan_at(3)), "frame 3 of the input holds NaN or inf"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_refused_before_anything_is_written(tmp_path, case):
    kw, message = CASES[case]
    kw = dict(kw)
    obs = kw.pop("obs", np.asarray(_obs()))
    with pytest.raises(SaliencyInputError, match=message):
        _run(tmp_path, obs, **kw)
    assert not (tmp_path / "out").exists()


def test_above_the_scan_size_each_chunk_is_checked_as_it_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(job, "SCAN_BYTES", 1)
    with pytest.raises(SaliencyInputError, match=r"frames 2:4: frame 3 of the input holds NaN"):
        _run(tmp_path, _nan_at(3))
    assert sorted(p.name for p in (tmp_path / "out" / "gradient").glob("chunk_*")) == ["chunk_0000000.npy"]


def test_a_clean_job_checks_each_frame_once(tmp_path, monkeypatch):
    from jaxsal import checks

    seen = []
    real = checks.check_finite
    monkeypatch.setattr(checks, "check_finite", lambda x, *a: seen.append(len(x)) or real(x, *a))
    out, summary = _run(tmp_path, np.asarray(_obs(6), np.float32))
    assert summary["complete"] and sum(seen) == 6, seen
