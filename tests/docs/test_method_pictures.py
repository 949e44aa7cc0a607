"""Every method has a picture: its page shows a committed PNG of its maps, the gallery page lists every
method and shows them side by side, and the README and the home page show the hero picture. The slow test
runs the drawing script (`docs/_build/method_pictures.py --tiny --out DIR`) and checks that it writes one
picture per registered method, each with its maps visible over the frames."""
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import jaxsal
from tests._support import ROOT

DOCS = ROOT / "docs"
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+\.png)\)")
MAX_BYTES = 150_000
METHODS = [m for m in jaxsal.methods() if jaxsal.METHODS[m].__module__.startswith("jaxsal.")]  # not tests' stand-ins


def _pictures(page: Path) -> list[Path]:
    """The PNGs a Markdown page shows, resolved as GitHub and MkDocs both resolve them (relative to the page)."""
    return [(page.parent / t).resolve() for t in IMAGE.findall(page.read_text())]


def _committed(path: Path) -> bool:
    """Tracked by git (true outside a git checkout, where only existence can be checked)."""
    proc = subprocess.run(["git", "ls-files", "--error-unmatch", str(path)], cwd=ROOT, capture_output=True)
    return proc.returncode == 0 or b"not a git repository" in proc.stderr


def _check_png(path: Path) -> list[str]:
    if not path.is_file():
        return [f"{path.relative_to(ROOT)} is missing"]
    bad = [] if _committed(path) else [f"{path.relative_to(ROOT)} is not committed"]
    if path.stat().st_size > MAX_BYTES:
        bad.append(f"{path.relative_to(ROOT)}: {path.stat().st_size} bytes, over {MAX_BYTES}")
    with Image.open(path) as img:
        if img.format != "PNG":
            bad.append(f"{path.relative_to(ROOT)} is not a PNG")
    return bad


@pytest.mark.parametrize("method", METHODS)
def test_every_method_page_shows_its_committed_picture(method):
    page = DOCS / "methods" / f"{method}.md"
    own = DOCS / "images" / "methods" / f"{method}.png"
    shown = _pictures(page)
    assert own in shown, f"docs/methods/{method}.md does not show ../images/methods/{method}.png"
    assert not _check_png(own), _check_png(own)


def test_the_gallery_lists_and_shows_every_method():
    page = DOCS / "methods" / "gallery.md"
    text = page.read_text()
    missing = [m for m in METHODS if f"[`{m}`]({m}.md)" not in text]
    assert not missing, f"docs/methods/gallery.md does not list {missing}"
    shown = _pictures(page)
    assert shown, "the gallery shows no picture"
    assert not [b for p in shown for b in _check_png(p)], [b for p in shown for b in _check_png(p)]
    assert "methods/gallery.md" in (ROOT / "mkdocs.yml").read_text(), "not in the site's navigation"
    for linking in (DOCS / "index.md", DOCS / "methods" / "index.md"):
        assert "gallery.md)" in linking.read_text(), f"{linking.relative_to(ROOT)} does not link the gallery"


def test_the_readme_and_the_home_page_show_the_hero():
    hero = DOCS / "images" / "hero.png"
    for page in (ROOT / "README.md", DOCS / "index.md"):
        assert hero in _pictures(page), f"{page.relative_to(ROOT)} does not show docs/images/hero.png"
    assert not _check_png(hero), _check_png(hero)


def _coloured_share(rgb: np.ndarray) -> float:
    """Share of a picture's pixels with a clear colour (the frames are grey; the maps and colour bars are not)."""
    rgb = rgb.astype(np.int16)
    return float(np.mean(rgb.max(-1) - rgb.min(-1) > 40))


def _share(path: Path) -> float:
    with Image.open(path) as img:
        return _coloured_share(np.asarray(img.convert("RGB")))


def _script():
    spec = importlib.util.spec_from_file_location("method_pictures", DOCS / "_build" / "method_pictures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_script_draws_one_visible_picture_per_registered_method(tmp_path):
    out = tmp_path / "pictures"
    proc = subprocess.run([sys.executable, str(DOCS / "_build" / "method_pictures.py"), "--tiny", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    # the registry as the script sees it (a fresh process: no test's stand-in methods)
    listed = subprocess.run([sys.executable, "-c", "import jaxsal; print(' '.join(jaxsal.methods()))"],
                            capture_output=True, text=True, check=True).stdout.split()
    assert set(METHODS) <= set(listed)
    written = sorted(p.name for p in out.glob("*.png"))
    expected = [f"{m}.png" for m in listed] + ["gallery_breakout.png", "gallery_mspacman.png", "hero.png"]
    assert written == sorted(expected), written
    # the floor: the same figure with every map 0 (drawn clear), where only the colour bars are coloured
    mp = _script()
    import matplotlib
    matplotlib.use("Agg")
    with np.load(mp.FRAMES) as f:
        blank = {str(a): {"obs": f[f"{a}_obs"], "steps": f[f"{a}_steps"], "actions": np.zeros(len(f[f"{a}_obs"]), int),
                          "maps": {"gradient": np.zeros(f[f"{a}_obs"].shape[:3], np.float32)}} for a in f["agents"]}
    mp.save_png(mp.method_figure("gradient", blank), tmp_path / "blank.png")
    floor = _share(tmp_path / "blank.png")
    for name in written:
        with Image.open(out / name) as img:
            rgb = np.asarray(img.convert("RGB"))
        assert rgb.std() > 10, f"{name} is (nearly) constant"
        assert len(np.unique(rgb.reshape(-1, 3), axis=0)) > 32, f"{name} has too few colours"
        if name.removesuffix(".png") in listed:
            assert _coloured_share(rgb) > floor + 0.02, f"{name}: the maps are not visible over the frames"
