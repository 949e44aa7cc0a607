"""Build `.gpu_bundle/`: what a GPU machine without network needs to train the Atari agents.

    python -m jaxsal_agents.gpu_bundle            # here, where PyPI is reachable; then carry .gpu_bundle

The lent GPU machines have Python 3.12 with jax (CUDA), flax, optax, orbax, scikit-image and
torch, but no EnvPool, and no network. EnvPool's wheel (53 MB) and its asset wheel (90 MB)
exceed what may travel with the working tree (64 MiB), so this downloads the cp312 wheels from
PyPI, unpacks them into `.gpu_bundle/site/` (put on PYTHONPATH there), and keeps only what
Atari needs: EnvPool's core and Atari family (its entry module rewritten to register Atari
alone) and the ROMs of our games (~14 MB in all). `python -m jaxsal_agents.gpu_bundle --check` imports EnvPool from the
bundle and steps every game (run it with a Python 3.12).
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from .envs import ATARI_GAMES

ROOT = Path(__file__).resolve().parent.parent
BUNDLE = ROOT / ".gpu_bundle"
WHEELS = {"envpool": "envpool==1.2.5", "envpool_assets": "envpool-assets>=0.3,<0.4", "dm_env": "dm-env",
          "gymnasium": "gymnasium", "farama_notifications": "farama-notifications", "optree": "optree",
          "types_protobuf": "types-protobuf"}
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
ROM_NAMES = {"pong": "pong", "breakout": "breakout", "mspacman": "ms_pacman",
             "spaceinvaders": "space_invaders", "frostbite": "frostbite", "seaquest": "seaquest"}


def download(dest: Path, python: str = "3.12"):
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", python, "--implementation", "cp", "-d", str(dest)]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd + list(WHEELS.values()), check=True)


def keep(name: str) -> bool:
    """Which files of the unpacked wheels stay: Python files, EnvPool's Atari parts, our ROMs."""
    parts = name.split("/")
    if parts[0] == "envpool":  # the core and the Atari family (entry.py is rewritten for Atari)
        return len(parts) == 2 or parts[1] in ("atari", "python")
    if parts[0] == "envpool_assets":
        if name.endswith(".py"):
            return True
        roms = {f"{r}.bin" for r in ROM_NAMES.values()}
        return len(parts) >= 3 and parts[1] == "atari" and parts[-1] in roms
    return True


def build(dest: Path = BUNDLE) -> dict:
    wheels = dest / "wheels"
    site = dest / "site"
    shutil.rmtree(dest, ignore_errors=True)
    wheels.mkdir(parents=True)
    download(wheels)
    kept = dropped = 0
    for whl in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(whl) as z:
            for info in z.infolist():
                if keep(info.filename):
                    z.extract(info, site)
                    kept += info.file_size
                else:
                    dropped += info.file_size
    shutil.rmtree(wheels)
    # EnvPool's entry module imports every family's registration (and so its extension);
    # the bundle carries only Atari, so only Atari registers.
    (site / "envpool" / "entry.py").write_text('"""Atari-only entry (jaxsal GPU bundle)."""\n'
                                               "import envpool.atari.registration  # noqa: F401\n")
    for so in site.rglob("*.so"):
        so.chmod(0o755)
    manifest = {"wheels": list(WHEELS.values()), "python": "3.12", "kept_mb": round(kept / 2 ** 20, 1),
                "dropped_mb": round(dropped / 2 ** 20, 1), "games": sorted(ATARI_GAMES)}
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def check():
    """Import EnvPool from wherever it is on the path and step every Atari game once."""
    import numpy as np

    from .envs import make_env
    for game in ATARI_GAMES:
        env = make_env(game, 2, train=True)
        obs = env.reset()
        obs, *_ = env.step(np.zeros(2, np.int32))
        assert obs.shape == (2, 84, 84, 4), obs.shape
        print(f"{game}: ok", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="step every game with the EnvPool on the path")
    a = p.parse_args(argv)
    if a.check:
        check()
        return
    m = build()
    size = sum(f.stat().st_size for f in BUNDLE.rglob("*") if f.is_file()) / 2 ** 20
    print(f"{BUNDLE}: {size:.1f} MB on disk (kept {m['kept_mb']} MB, dropped {m['dropped_mb']} MB of the wheels)")


if __name__ == "__main__":
    main()
