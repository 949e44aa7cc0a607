"""Rendering: colour scales (Paper A signed green/red, heat, Greydanus), valid PNG/GIF/MP4 files, gallery."""
import numpy as np
import pytest
from PIL import Image

import jaxsal
from jaxsal import render
from jaxsal.cli import main
from tests.test_cli_support import frames, make_agent_files


def test_signed_scale_is_paper_a():
    rng = np.random.default_rng(0)
    maps = rng.normal(0.0, 2.0, (5, 84, 84))
    sc = render.Scale(maps, "signed")
    assert sc.scheme == "signed"
    z = (maps - maps.mean()) / maps.std() * 0.1
    np.testing.assert_allclose(sc.values(maps), np.clip(z, -1, 1))
    frame = np.full((84, 84), 0.5)
    m = np.zeros((84, 84))
    m[0, 0], m[0, 1] = maps.mean() + 100 * maps.std(), maps.mean() - 100 * maps.std()  # +1 and -1 after clipping
    img = sc.overlay(frame, m).astype(int)
    # alpha 0.5 at full strength: half grey, half pure green / pure red
    assert tuple(img[0, 0]) == (64, 191, 64) and tuple(img[0, 1]) == (191, 64, 64)


def test_heat_scale_fixed_across_frames_and_auto_choice():
    maps = np.zeros((3, 84, 84))
    maps[0, 10, 10] = 1.0
    maps[2, 10, 10] = 4.0
    sc = render.Scale(maps, "auto")
    assert sc.scheme == "heat"
    # the same value looks the same in every frame of the video
    v0, v2 = sc.values(maps[0]), sc.values(maps[2] / 4.0)
    np.testing.assert_array_equal(v0, v2)
    assert render.Scale(maps - 1.0, "auto").scheme == "signed"
    with pytest.raises(jaxsal.SaliencyInputError):
        render.Scale(maps, "rainbow")
    with pytest.raises(jaxsal.SaliencyInputError, match="NaN"):
        render.Scale(np.full((1, 4, 4), np.nan))


def test_greydanus_actor_blue_critic_red():
    frame = np.zeros((84, 84))
    actor, critic = np.zeros((84, 84)), np.zeros((84, 84))
    actor[5, 5], critic[7, 7] = 1.0, 1.0
    sa, sc = render.Scale(actor[None], "heat"), render.Scale(critic[None], "heat")
    img = render.greydanus_overlay(frame, actor, critic, sa, sc)
    assert tuple(img[5, 5]) == (0, 0, 255) and tuple(img[7, 7]) == (255, 0, 0) and img[0, 0].sum() == 0


def test_files_are_valid_png_gif_mp4(tmp_path):
    import imageio.v3 as iio

    x = frames(6, size=84)
    rng = np.random.default_rng(1)
    maps = {"signed": rng.normal(size=(6, 84, 84)), "heat": rng.random((6, 84, 84)),
            "perframe": rng.random((6, 84, 84, 4))}
    g = render.grid_png(tmp_path / "grid.png", x, maps, [0, 3, 5], scale=2)
    s = render.stack_png(tmp_path / "stack.png", x, maps, 2, scale=2)
    with Image.open(g) as im:
        assert im.format == "PNG" and im.size[0] == 4 * 84 * 2 and im.size[1] > 3 * 84 * 2
    with Image.open(s) as im:
        assert im.format == "PNG" and im.size[0] == 4 * 84 * 2
    gif = render.video(tmp_path / "v.gif", x, maps, fps=10, scale=1)
    mp4 = render.video(tmp_path / "v.mp4", x, maps, fps=10, scale=2, greydanus=("heat", "perframe"))
    with Image.open(gif) as im:
        assert im.format == "GIF" and im.n_frames == 6
    assert mp4.read_bytes()[4:8] == b"ftyp"
    got = iio.imread(mp4, plugin="FFMPEG" if False else None, index=None)
    assert got.shape[0] == 6 and got.shape[-1] == 3
    with pytest.raises(jaxsal.SaliencyInputError, match="mp4 or .gif"):
        render.video(tmp_path / "v.avi", x, maps)
    with pytest.raises(jaxsal.SaliencyInputError, match="entries"):
        render.video(tmp_path / "v.gif", x[:3], maps)


def test_render_command_gallery(tmp_path, capsys):
    card = make_agent_files(tmp_path / "agent")
    np.save(tmp_path / "x.npy", frames(8))
    assert main(["explain", "--agent", str(card), "--methods", "standin_grad,standin_pool", "--input",
                 str(tmp_path / "x.npy"), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    assert main(["render", str(tmp_path / "o"), "--frames", "2:8", "--greydanus", "standin_grad,standin_pool",
                 "--grid-frames", "3", "--fps", "5"]) == 0
    out = capsys.readouterr().out
    gal = tmp_path / "o" / "gallery"
    assert str(gal / "index.html") in out
    page = (gal / "index.html").read_text()
    for name in ("grid.png", "episode.mp4", "episode.gif", "standin_grad", "standin_pool", "green positive"):
        assert name in page
    for p in gal.glob("*.png"):
        with Image.open(p) as im:
            im.verify()
    with Image.open(gal / "episode.gif") as im:
        assert im.n_frames == 6
    # bad render requests: one line, exit 2
    for argv, frag in ((["render", str(tmp_path / "o"), "--methods", "rise"], "no maps for 'rise'"),
                       (["render", str(tmp_path / "o"), "--frames", "9:12"], "empty"),
                       (["render", str(tmp_path / "o"), "--frames", "a:b"], "START:STOP"),
                       (["render", str(tmp_path / "nowhere")], "not a jaxsal output"),
                       (["render", str(tmp_path / "o"), "--greydanus", "standin_grad"], "ACTOR,CRITIC"),
                       (["render", str(tmp_path / "o"), "--video", "avi"], "mp4, gif")):
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("jaxsal: error:") and "\n" not in err and frag in err, (argv, err)


def test_minatar_states_drawn_as_object_planes(tmp_path):
    x = np.zeros((2, 10, 10, 4), np.uint8)
    x[0, 1, 2, 0] = 1
    x[0, 5, 5, 3] = 1
    img = render.last_frame(x[0])
    assert img[1, 2] == 1 and img[5, 5] == 1 and img.sum() == 2
    maps = {"m": np.random.default_rng(0).random((2, 10, 10))}
    p = render.grid_png(tmp_path / "g.png", x, maps, [0, 1], scale=1)
    with Image.open(p) as im:
        assert im.size[0] == 2 * 10 * 16  # upscaled to stay visible
