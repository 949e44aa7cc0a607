"""Rendering: colour scales (Paper A signed green/red, heat, Greydanus), valid PNG/GIF/MP4 files, gallery."""
import json

import numpy as np
import pytest
from PIL import Image

import jaxsal
from jaxsal.cli.render import gallery, pictures, scale as scales
from jaxsal.cli.render._draw import last_frame
from jaxsal.cli import main
from tests._support.cli_support import frames, make_agent_files


def test_signed_scale_is_paper_a():
    rng = np.random.default_rng(0)
    maps = rng.normal(0.0, 2.0, (5, 84, 84))
    sc = scales.Scale(maps, "signed")
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
    sc = scales.Scale(maps, "auto")
    assert sc.scheme == "heat"
    # the same value looks the same in every frame of the video
    v0, v2 = sc.values(maps[0]), sc.values(maps[2] / 4.0)
    np.testing.assert_array_equal(v0, v2)
    assert scales.Scale(maps - 1.0, "auto").scheme == "signed"
    with pytest.raises(jaxsal.SaliencyInputError):
        scales.Scale(maps, "rainbow")
    with pytest.raises(jaxsal.SaliencyInputError, match="NaN"):
        scales.Scale(np.full((1, 4, 4), np.nan))


def test_greydanus_actor_blue_critic_red():
    frame = np.zeros((84, 84))
    actor, critic = np.zeros((84, 84)), np.zeros((84, 84))
    actor[5, 5], critic[7, 7] = 1.0, 1.0
    sa, sc = scales.Scale(actor[None], "heat"), scales.Scale(critic[None], "heat")
    img = scales.greydanus_overlay(frame, actor, critic, sa, sc)
    assert tuple(img[5, 5]) == (0, 0, 255) and tuple(img[7, 7]) == (255, 0, 0) and img[0, 0].sum() == 0


def test_files_are_valid_png_gif_mp4(tmp_path):
    import imageio.v3 as iio

    x = frames(6, size=84)
    rng = np.random.default_rng(1)
    maps = {"signed": rng.normal(size=(6, 84, 84)), "heat": rng.random((6, 84, 84)),
            "perframe": rng.random((6, 84, 84, 4))}
    g = pictures.grid_png(tmp_path / "grid.png", x, maps, [0, 3, 5], scale=2)
    s = pictures.stack_png(tmp_path / "stack.png", x, maps, 2, scale=2)
    with Image.open(g) as im:
        assert im.format == "PNG" and im.size[0] == 4 * 84 * 2 and im.size[1] > 3 * 84 * 2
    with Image.open(s) as im:
        assert im.format == "PNG" and im.size[0] == 4 * 84 * 2
    gif = pictures.video(tmp_path / "v.gif", x, maps, fps=10, scale=1)
    mp4 = pictures.video(tmp_path / "v.mp4", x, maps, fps=10, scale=2, greydanus=("heat", "perframe"))
    with Image.open(gif) as im:
        assert im.format == "GIF" and im.n_frames == 6
    assert mp4.read_bytes()[4:8] == b"ftyp"
    got = iio.imread(mp4, plugin="FFMPEG" if False else None, index=None)
    assert got.shape[0] == 6 and got.shape[-1] == 3
    with pytest.raises(jaxsal.SaliencyInputError, match="mp4 or .gif"):
        pictures.video(tmp_path / "v.avi", x, maps)
    with pytest.raises(jaxsal.SaliencyInputError, match="entries"):
        pictures.video(tmp_path / "v.gif", x[:3], maps)


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
    img = last_frame(x[0])
    assert img[1, 2] == 1 and img[5, 5] == 1 and img.sum() == 2
    maps = {"m": np.random.default_rng(0).random((2, 10, 10))}
    p = pictures.grid_png(tmp_path / "g.png", x, maps, [0, 1], scale=1)
    with Image.open(p) as im:
        assert im.size[0] == 2 * 10 * 16  # upscaled to stay visible


def _panels(img, rows, cols, tile, label=14):
    """The map panels of a stack PNG: rows of `cols` tiles (tile x tile px) under a label strip each."""
    out = []
    for r in range(rows):
        y = r * (tile + label) + label
        out.append([img[y:y + tile, c * tile:(c + 1) * tile].astype(int) for c in range(cols)])
    return out


def test_stack_png_every_panel_shows_its_frames_map(tmp_path):
    """Per-stacked-frame view: a map of the whole stack is drawn over every stacked frame (no blank
    panels), per-frame maps on a scale fitted to per-frame maps (a quarter of the stack's sum would
    leave them invisible)."""
    card = make_agent_files(tmp_path / "agent")
    rng = np.random.default_rng(0)
    x = np.zeros((4, 10, 10, 4), np.uint8)          # black frames: every visible pixel is the map
    np.save(tmp_path / "x.npy", x)
    assert main(["explain", "--agent", str(card), "--methods", "standin_pool", "--input",
                 str(tmp_path / "x.npy"), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    stack = {"one": rng.random((4, 10, 10)), "each": rng.random((4, 10, 10, 4))}
    for k, m in stack.items():       # maps of the right kind into the job's directory
        cfg = json.loads((tmp_path / "o" / "manifest.json").read_text())
        cfg["config"]["methods"][k] = cfg["config"]["methods"]["standin_pool"]
        (tmp_path / "o" / "manifest.json").write_text(json.dumps(cfg))
        (tmp_path / "o" / k).mkdir()
        np.save(tmp_path / "o" / k / "chunk_0000000.npy", m.astype(np.float32))
    res = gallery.render_dir(tmp_path / "o", methods=["one", "each"], videos=(), grid_frames=2, scheme="heat")
    img = np.asarray(Image.open(res["pngs"][1]).convert("RGB"))
    tile = 160                                         # 10x10 frames are upscaled x16
    one, each = _panels(img, 3, 4, tile)[1:]
    for row, name in ((one, "one"), (each, "each")):
        for j, p in enumerate(row):
            assert not (p == 255).all(), f"{name}: panel of frame t-{3 - j} is blank"
            assert p.max() >= 100, f"{name}: panel of frame t-{3 - j} is too faint to see ({p.max()})"
    np.testing.assert_array_equal(one[0], one[3])     # one map, the same over each (black) frame


def test_legend_text_is_never_cut():
    """Narrow figures (one method, small frames) and long scale descriptions: the legend wraps, every
    character of the name, the bar's end values and the description is inside the figure."""
    from PIL import ImageDraw

    rng = np.random.default_rng(0)
    sc = scales.Scale(rng.normal(size=(3, 10, 10)), "heat")   # signed maps on heat: the long description
    assert "negative values not shown" in sc.describe()

    def ink(a):  # darkness of the grey (text) pixels; the colour bar is not grey
        a = np.asarray(a).astype(int)
        grey = (a[..., 0] == a[..., 1]) & (a[..., 1] == a[..., 2])
        return int((255 - a[..., 0])[grey].sum())

    def alone(text, fill):
        im = Image.new("RGB", (3000, 14), (255, 255, 255))
        ImageDraw.Draw(im).text((2, 0), text, fill=fill)
        return ink(im)

    name, (lo, hi) = "a_long_method_alias", sc.ends()
    want = alone(name, (0, 0, 0)) + alone(f"{lo} .. {hi}", (0, 0, 0)) + alone(sc.describe(), (60, 60, 60))
    for width in (480, 320, 200):
        leg = scales.legend({name: sc}, width)
        assert leg.shape[1] == width
        assert abs(ink(leg) - want) <= 0.03 * want, (width, ink(leg), want)


PAYLOAD = '"><script>alert(1)</script><img src=x onerror="alert(2)'


def _poison(x):
    """Every string in a JSON value replaced by PAYLOAD, every number too (a crafted file need not
    keep the types), dict keys included."""
    if isinstance(x, dict):
        return {PAYLOAD + str(i): _poison(v) for i, v in enumerate(x.values())}
    if isinstance(x, list):
        return [_poison(v) for v in x]
    return PAYLOAD


def test_the_gallery_escapes_everything_a_folder_holds(tmp_path, capsys):
    """A maps folder from someone else cannot put script into index.html: every value of its summary
    and manifest written into the page is HTML-escaped, attributes too."""
    card = make_agent_files(tmp_path / "agent")
    np.save(tmp_path / "x.npy", frames(4))
    out = tmp_path / "o"
    assert main(["explain", "--agent", str(card), "--methods", "standin_grad", "--input", str(tmp_path / "x.npy"),
                 "--out", str(out), "--quiet"]) == 0
    summary = json.loads((out / "summary-p0.json").read_text())
    (out / "summary-p0.json").write_text(json.dumps(_poison(summary)))
    (out / "summary-p1.json").write_text(json.dumps(dict(summary, maps_per_s={PAYLOAD: PAYLOAD}, out=PAYLOAD)))
    manifest = json.loads((out / "manifest.json").read_text())
    manifest.update(version=PAYLOAD, created=PAYLOAD)
    manifest["config"].update(agent=PAYLOAD, target=PAYLOAD)
    manifest["config"]["methods"]["standin_grad"]["options"] = {PAYLOAD: PAYLOAD}
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert main(["render", str(out), "--video", "none", "--quiet"]) == 0, capsys.readouterr().err
    page = (out / "gallery" / "index.html").read_text()
    assert "<script" not in page and "onerror=\"" not in page and PAYLOAD not in page
    assert page.count("&lt;script&gt;") >= 8 and "&quot;&gt;&lt;script&gt;" in page
@pytest.mark.slow  # 3-8 s (a subprocess, a game or a whole job): the slow stage, which CI runs
def test_the_per_frame_hint_names_only_methods_that_give_per_frame_maps():
    """The stack picture suggests `--option M.per_frame=true` exactly where it works on a plain
    (not time-distributed) CNN; layer-resolution and perturbation methods refuse it."""
    import flax.linen as nn
    import jax

    class Tiny(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.relu(nn.Conv(4, (3, 3), (2, 2), name="conv1")(x.astype(np.float32) / 255.0))
            return nn.Dense(3, name="q")(x.reshape(x.shape[0], -1))

    obs = np.random.default_rng(0).integers(0, 256, (1, 16, 16, 4), np.uint8)
    params = Tiny().init(jax.random.PRNGKey(0), obs)
    wrong = []
    for m in [m for m in jaxsal.methods() if jaxsal.METHODS[m].__module__.startswith("jaxsal.")]:
        small = {k: 2 for k in ("n_samples", "n_masks", "steps") if k in jaxsal.method_options(m)}
        try:
            jaxsal.explain(Tiny().apply, params, obs, method=m, per_frame=True, key=jax.random.PRNGKey(0), **small)
            works = True
        except jaxsal.SaliencyInputError:
            works = False
        if works != bool(pictures._per_frame_hint(m)):
            wrong.append(m)
    assert not wrong, f"the hint is wrong for {wrong}"
