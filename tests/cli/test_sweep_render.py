"""`jaxsal render DIR` on a sweep output: curves.png (each metric against checkpoint, one line per
method, one panel per metric, agents x inputs as line styles) and grid.png (one frame per cell,
rows = agent / checkpoint / input, columns = frame | method overlays)."""
import shutil

import numpy as np
import pytest
from PIL import Image

import jaxsal
from jaxsal.cli.render import sweep as rs
from jaxsal.cli import main
from tests._support.cli_support import frames, make_agent_files

N = 3
CONFIG = """
agents = ["runs/*.msgpack", { spec = "runs/tiny0.json", name = "single" }]
inputs = ["buf.npy"]
metrics = ["insertion"]
chunk = 3
[methods]
gradient = {}
gradcam = { layer = "conv1" }
"""


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    d = tmp_path_factory.mktemp("sweep_render")
    make_agent_files(d / "runs", seed=0)
    make_agent_files(d / "runs", seed=1)
    np.save(d / "buf.npy", frames(N, seed=1))
    (d / "sweep.toml").write_text(CONFIG)
    assert main(["sweep", str(d / "sweep.toml"), "--out", str(d / "out"), "--quiet"]) == 0
    return d, d / "out"


def test_curve_layout_one_panel_per_metric_one_line_per_method_and_group(swept):
    _, out = swept
    t = jaxsal.load_sweep(out)
    panels, pos, xlabel = rs.curve_panels(t)
    names = [p.metric for p in panels]
    assert names == ["map_mass", "map_positive_share", "map_entropy", "insertion_auc"]  # all-NaN columns dropped
    assert pos == {"tiny0": 0.0, "tiny1": 1.0, "default": 2.0} and "order" in xlabel  # "default": no number
    for p in panels:
        # 2 methods x 2 groups ("runs / buf" with two checkpoints, "single / buf" with one)
        assert sorted((ln.method, ln.group, len(ln.x)) for ln in p.lines) == [
            ("gradcam", "runs / buf", 2), ("gradcam", "single / buf", 1),
            ("gradient", "runs / buf", 2), ("gradient", "single / buf", 1)]
    ins = next(p for p in panels if p.metric == "insertion_auc")
    line = next(ln for ln in ins.lines if ln.method == "gradcam" and ln.group == "runs / buf")
    rows = [r for r in range(len(t["method"])) if t["method"][r] == "gradcam" and t["agent"][r] == "runs"]
    assert line.y == [float(t["insertion_auc"][r]) for r in rows]                  # tiny0 then tiny1


def test_a_defined_share_gets_a_panel_only_where_some_frames_were_undefined():
    t = {"status": np.array(["ok", "ok"]), "insertion_auc": np.array([0.4, np.nan]),   # no frame defined: a gap
         "insertion_defined": np.array([1.0, 0.0]), "deletion_auc": np.array([0.2, 0.3]),
         "deletion_defined": np.array([1.0, 1.0])}
    assert rs.metric_columns(t) == ["insertion_auc", "insertion_defined", "deletion_auc"]


def test_checkpoint_positions_numbers_or_order():
    pos, label = rs.checkpoint_positions(["step_200", "step_1000", "step_30"])
    assert pos == {"step_200": 200.0, "step_1000": 1000.0, "step_30": 30.0} and "number" in label
    pos, label = rs.checkpoint_positions(["final", "best", "final"])
    assert pos == {"final": 0.0, "best": 1.0} and "order" in label
    pos, _ = rs.checkpoint_positions(["a1", "b1"])                                  # the same number twice
    assert pos == {"a1": 0.0, "b1": 1.0}


def test_the_pictures_keep_the_tables_natural_checkpoint_order():
    """Rows of grid.png and points of curves.png follow the checkpoints' natural order (step_2 before
    step_10), as the table does, whether x is the number in the names or the order itself."""
    for names, xs in ((["step_2", "step_10", "step_100"], [2.0, 10.0, 100.0]),
                      (["v2-final", "v10-best", "v10-final"], [0.0, 1.0, 2.0])):   # 10 twice: the order
        n = len(names)
        t = {"agent": np.array(["a"] * n), "checkpoint": np.array(names), "input": np.array(["buf"] * n),
             "method": np.array(["gradient"] * n), "status": np.array(["ok"] * n),
             "insertion_auc": np.arange(n, dtype=float)}
        assert [r[1] for r in rs.grid_layout(t).rows] == names
        panels, pos, _ = rs.curve_panels(t)
        (line,), = [p.lines for p in panels]
        assert [pos[c] for c in names] == xs and line.x == xs and line.y == [0.0, 1.0, 2.0]


def test_render_sweep_writes_both_pngs_with_the_layouts_drawn(swept, tmp_path):
    _, out = swept
    res = rs.render_sweep(out, gallery=tmp_path / "g")
    curves, grid = res["pngs"]
    assert curves.name == "curves.png" and grid.name == "grid.png" and res["html"].exists()
    for p in (curves, grid):
        with Image.open(p) as im:
            im.verify()                                                             # a valid PNG
    # the curves figure: one axes per panel, 4 metrics in a 3-column layout
    panels, pos, xlabel = rs.curve_panels(jaxsal.load_sweep(out))
    _, axes = rs.curves_png(tmp_path / "c.png", panels, pos, xlabel)
    assert len(axes) == 4 and [ax.get_title() for ax in axes] == [p.metric for p in panels]
    assert [len(ax.get_lines()) for ax in axes] == [4] * 4
    with Image.open(curves) as im:
        assert im.size == (3 * 420, 2 * 320)                                        # 2 rows x 3 columns
    # the grid: 3 rows (runs/tiny0, runs/tiny1, single/default) x (frame + 2 methods)
    lay = res["grid"]
    assert lay.rows == [("runs", "tiny0", "buf"), ("runs", "tiny1", "buf"), ("single", "default", "buf")]
    assert lay.methods == ["gradient", "gradcam"] and len(lay.cells) == 6 and all(lay.cells.values())
    _, (h, w) = rs.grid_png(tmp_path / "g2.png", out, lay)
    with Image.open(grid) as im:
        a = np.asarray(im.convert("RGB"))
    assert a.shape[1] == 3 * w and (h, w) == (160, 160)                            # 10x10 frames, x16
    # rows: a caption strip (14) + a method label strip (14) + the tile, then the colour legend below
    assert a.shape[0] > 3 * (h + 28)
    first = a[28:28 + h]
    assert not np.array_equal(first[:, w:2 * w], first[:, :w])                      # an overlay, not the frame


def test_a_failed_cell_is_a_grey_tile_and_left_out_of_the_curves(swept, tmp_path):
    _, ref = swept
    out = tmp_path / "out"
    shutil.copytree(ref, out)
    import csv

    rows = list(csv.reader(open(out / "results.csv")))
    col = rows[0].index("status")
    rows[2][col] = "error"                                                          # runs/tiny0 gradcam
    with open(out / "results.csv", "w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(rows)
    res = rs.render_sweep(out)
    assert res["grid"].cells[(0, "gradcam")] is None and res["grid"].cells[(0, "gradient")]
    line = next(ln for ln in res["panels"][0].lines if ln.method == "gradcam" and ln.group == "runs / buf")
    assert len(line.x) == 1                                                         # tiny1 only
    with Image.open(out / "gallery" / "grid.png") as im:
        a = np.asarray(im.convert("RGB"))
    tile = a[28 + 40:28 + 160, 2 * 160:3 * 160]                                    # below the tile's text
    assert (tile == 90).all()                                                       # the grey "no map" tile
    assert (a[28:28 + 40, 2 * 160:3 * 160] > 200).all(-1).any()                     # saying so in white


def test_the_cli_renders_a_sweep_dir(swept, tmp_path, capsys):
    _, out = swept
    assert main(["render", str(out), "--out", str(tmp_path / "g"), "--methods", "gradcam", "--frames", "2:"]) == 0
    said = capsys.readouterr().out
    assert "4 panels" in said and "3 rows x 1 methods" in said
    assert (tmp_path / "g" / "curves.png").exists() and (tmp_path / "g" / "grid.png").exists()
    assert main(["render", str(out), "--out", str(tmp_path / "g"), "--frames", "7:"]) == 2   # beyond N frames
    assert "frame 7" in capsys.readouterr().err
    assert main(["render", str(out), "--out", str(tmp_path / "g"), "--methods", "nosuch"]) == 2
    assert "no method 'nosuch'" in capsys.readouterr().err


def test_played_inputs_each_row_its_own_rollout(tmp_path):
    make_agent_files(tmp_path / "runs", seed=0)
    make_agent_files(tmp_path / "runs", seed=1)
    (tmp_path / "sweep.toml").write_text('agents = ["runs/*.msgpack"]\ninputs = [{ play = 3, seed = 2 }]\n'
                                         '[methods]\ngradient = {}\n')
    assert main(["sweep", str(tmp_path / "sweep.toml"), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    res = rs.render_sweep(tmp_path / "out")
    lay = res["grid"]
    assert lay.rows == [("runs", "tiny0", "play3-seed2"), ("runs", "tiny1", "play3-seed2")]
    # each row draws its own checkpoint's rollout (from the cell's job), not the first row's
    for r, (a, c, i) in enumerate(lay.rows):
        x, m = rs._cell_frame_and_map(tmp_path / "out", lay.cells[(r, "gradient")], "gradient", 1)
        want = np.load(tmp_path / "out" / "cells" / a / c / i / "_rollout" / "input" / "obs.npy")[1]
        np.testing.assert_array_equal(x, want)
        np.testing.assert_array_equal(m, np.asarray(jaxsal.load_maps(
            tmp_path / "out" / "cells" / a / c / i / "gradient" / "job", "gradient"))[1])
    assert [p.metric for p in res["panels"]] == ["map_mass", "map_positive_share", "map_entropy"]


def test_a_sweep_with_no_finished_cell_is_one_line(swept, tmp_path, capsys):
    _, ref = swept
    out = tmp_path / "out"
    shutil.copytree(ref, out)
    text = (out / "results.csv").read_text().replace(",ok,", ",pending,")
    (out / "results.csv").write_text(text)
    assert main(["render", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no cell is finished" in err[0]
