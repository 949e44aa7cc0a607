"""Crafted and damaged objects files (`jaxsal explain --objects FILE`): one SaliencyInputError naming the file, what
is wrong and the fix, before anything is read past a member's header; never a MemoryError, a fix for another
problem, or class names that are not the file's. Each case says what it did before."""
from __future__ import annotations

import zipfile

import numpy as np
import pytest

import jaxsal
from jaxsal.io import object_files as objs
from tests._support.crafted_files import npy_header

BOXES = np.zeros((2, 4, 1, 4), np.int16)
BOXES[..., 2:] = 5
GOOD = dict(boxes=BOXES, labels=np.zeros((2, 4, 1), np.int8), classes=np.asarray(["ball"]), size=np.asarray([10, 10]))


def _with_member(tmp_path, name: str, member: str, data: bytes):
    """The good objects file with one member's bytes replaced (header and data written by hand)."""
    good = tmp_path / "good.npz"
    np.savez(good, **GOOD)
    with zipfile.ZipFile(good) as z:
        members = {n: z.read(n) for n in z.namelist()}
    path = tmp_path / f"{name}.npz"
    with zipfile.ZipFile(path, "w") as z:
        for n, b in {**members, member: data}.items():
            z.writestr(n, b)
    return path


def test_a_header_that_declares_more_than_the_file_holds(tmp_path):
    """Before: boxes whose header declares 10^12 states, "internal error MemoryError: Unable to allocate 29.1 TiB";
    a header one state longer than its data, a negative shape or a dtype of 4 GB per name, each told "store classes
    as a str array (np.asarray(names)), not objects"; a member without the .npy magic, "cannot read boxes: not a
    valid .npy array", naming neither the file nor the fix."""
    cases = {
        "huge": ("boxes.npy", npy_header((10 ** 12, 4, 1, 4), "<i2") + bytes(64),
                 r"declares \(1000000000000, 4, 1, 4\) int16, 32000000000000 bytes, but the file holds 64"),
        "one_more": ("boxes.npy", npy_header((3, 4, 1, 4), "<i2") + BOXES.tobytes(), "96 bytes, but the file holds 64"),
        "negative": ("labels.npy", npy_header((-1, 4, 1), "|i1") + bytes(8), r"negative shape \(-1, 4, 1\)"),
        "wide_names": ("classes.npy", npy_header((1,), "<U1000000000") + bytes(16), "header of array 'classes' cannot "
                                                                                     "be read"),
        "no_magic": ("boxes.npy", b"\x93NUMPZ" + bytes(100), "header of array 'boxes' cannot be read"),
    }
    for name, (member, data, says) in cases.items():
        path = _with_member(tmp_path, name, member, data)
        with pytest.raises(jaxsal.SaliencyInputError, match=f"objects file .*{name}.npz is corrupt .*{says}") as e:
            objs.read_objects(path)
        assert "record the boxes again" in str(e.value) and "\n" not in str(e.value), name
    assert objs.read_objects(tmp_path / "good.npz").classes == ("ball",)


def test_names_stored_as_bytes(tmp_path):
    """Class names saved as bytes were read as "b'ball'" (shares reported under that name, silently), and a game
    saved as bytes as "np.bytes_(b'pong')", matching no agent's game."""
    np.savez(tmp_path / "classes.npz", **dict(GOOD, classes=np.asarray([b"ball"])))
    with pytest.raises(jaxsal.SaliencyInputError, match=r"classes must be a 1-D str array .*decode bytes names"):
        objs.read_objects(tmp_path / "classes.npz")
    np.savez(tmp_path / "game.npz", **dict(GOOD, game=np.asarray(b"minatar-breakout")))
    with pytest.raises(jaxsal.SaliencyInputError, match=r"game must be one name \(np.asarray\('pong'\)\)"):
        objs.read_objects(tmp_path / "game.npz", game="minatar-breakout")


def test_a_class_name_that_names_nothing_on_one_line(tmp_path):
    """A class named "" or "  " was accepted, and its shares reported under no visible name in the summary lines (in a
    sweep's columns as class "x"); one named "ball\\nred" split the summary line in two. Each is refused naming the
    file, the class and the fix; other names still load as they are."""
    for name, (classes, says) in {"empty": (["ball", ""], "class name '' is empty"),
                                  "blank": (["ball", "  "], "class name '  ' is only whitespace"),
                                  "newline": (["ball", "ball\nred"], r"class name 'ball\\nred' holds '\\n'")}.items():
        path = tmp_path / f"{name}.npz"
        np.savez(path, **dict(GOOD, classes=np.asarray(classes)))
        with pytest.raises(jaxsal.SaliencyInputError, match=f"objects file .*{name}.npz: {says}.*give each class a "
                                                            "name") as e:
            objs.read_objects(path)
        assert "\n" not in str(e.value), name
    np.savez(tmp_path / "spaced.npz", **dict(GOOD, classes=np.asarray(["red ball", "ball"])))
    assert objs.read_objects(tmp_path / "spaced.npz").classes == ("red ball", "ball")
