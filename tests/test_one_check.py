"""Each check of an argument is written once: the unknown-option check in jaxsal.registry.check_options
(used by jaxsal.explain, a method function, the batch job and sweeps) and the number checks in
jaxsal.checks (used by the methods, the metrics and the CLI's flags). A source scan finds no second copy
of their messages, and every door gives the shared message."""
import re
from pathlib import Path

import numpy as np
import pytest

import jaxsal
from jaxsal.errors import CLIError, SaliencyInputError
from jaxsal.io import MethodSpec
from jaxsal.io.job import check_specs
from tests._support.conformance import MODEL, PARAMS, _obs

ROOT = Path(jaxsal.__file__).parent
COPIES = {
    # a method's unknown option
    r'f"method \{[^}]+\} has no option': {"registry.py"},
    # a number of the wrong kind or range
    r"must be (?:a positive int(?!\S* dividing)|an integer >=|a non-negative int|a finite number [<>]"
    r"|a positive number)": {
        "checks.py",
        "sizing.py",  # batch_size (check_batch_size): jaxsal.checks imports sizing, so sizing cannot import it
    },
}


def copies(pattern: str, root: Path = ROOT) -> dict:
    """file (relative to root) -> lines whose source matches `pattern`."""
    found = {}
    for p in sorted(root.rglob("*.py")):
        lines = [i + 1 for i, line in enumerate(p.read_text().splitlines()) if re.search(pattern, line)]
        if lines:
            found[p.relative_to(root).as_posix()] = lines
    return found


@pytest.mark.parametrize("pattern", list(COPIES))
def test_a_check_is_written_in_one_place(pattern):
    found = copies(pattern)
    extra = {f: lines for f, lines in found.items() if f not in COPIES[pattern]}
    assert not extra, f"call the shared check instead of writing it again: {extra}"
    assert set(found) == COPIES[pattern], found  # the owner still holds it


def test_the_scan_finds_a_planted_copy(tmp_path):
    (tmp_path / "job.py").write_text('raise E(f"method {s.method!r} has no option {bad}")\n'
                                     'raise E(f"--workers must be a positive integer, got {n}")\n'
                                     'raise E(f"num_frames must be a positive int dividing {c}")\n')
    assert copies(list(COPIES)[0], tmp_path) == {"job.py": [1]}
    assert copies(list(COPIES)[1], tmp_path) == {"job.py": [2]}


def test_every_door_gives_the_shared_unknown_option_message():
    want = "method 'gradient' has no option 'n_sample'"
    hint = "did you mean 'n_samples'"
    obs = _obs()
    with pytest.raises(SaliencyInputError, match=want):
        jaxsal.explain(MODEL.apply, PARAMS, obs, method="gradient", n_sample=2)
    with pytest.raises(SaliencyInputError, match=want):
        jaxsal.gradient(MODEL.apply, PARAMS, obs, n_sample=2)
    with pytest.raises(SaliencyInputError, match="method 'smoothgrad' has no option 'n_sample'") as e:
        check_specs([MethodSpec("smoothgrad", "smoothgrad", {"n_sample": 2})])
    assert hint in str(e.value) and "'key'" not in str(e.value)  # the job sets key and batch_size itself


def test_the_cli_flags_use_the_library_check():
    from jaxsal.cli._common import check_positive

    assert check_positive("--chunk", np.int64(3)) == 3
    for bad in (0, -2, 1.5, True):
        with pytest.raises(CLIError, match=r"--chunk must be an integer >= 1, got .*\(frames per chunk\)"):
            check_positive("--chunk", bad, " (frames per chunk)")
