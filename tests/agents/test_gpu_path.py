"""The GPU training path's CPU-side pieces: the EnvPool bundle's file filter and adopting results."""
import io
import json
import tarfile

import numpy as np

from jaxsal_agents.adopt_gpu import adopt
from jaxsal_agents.gpu_bundle import keep


def test_bundle_keeps_atari_and_our_roms_only():
    assert keep("envpool/__init__.py") and keep("envpool/registration.py")
    assert keep("envpool/atari/atari_envpool.so") and keep("envpool/python/protocol.py")
    assert not keep("envpool/mujoco/mujoco_gym_envpool.so") and not keep("envpool/vizdoom/bin/vizdoom")
    assert keep("envpool_assets/atari/roms/breakout.bin") and keep("envpool_assets/atari/roms/ms_pacman.bin")
    assert not keep("envpool_assets/atari/roms/zaxxon.bin") and not keep("envpool_assets/mujoco/x.xml")
    assert keep("gymnasium/core.py")


def _bundle(path, name, card, params_bytes, rows):
    with tarfile.open(path, "w:gz") as tar:
        for fname, data in ((f"{name}.json", json.dumps(card).encode()), (f"{name}.msgpack", params_bytes),
                            ("returns.csv", ("step,return,wall_s\n" + "".join(f"{s},{r},1\n" for s, r in rows)).encode())):
            info = tarfile.TarInfo(f"./{fname}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_adopt_replaces_only_a_better_agent(tmp_path):
    import jaxsal_agents

    src = jaxsal_agents.zoo.SHIPPED_DIR
    shipped, curves = tmp_path / "shipped", tmp_path / "curves"
    shipped.mkdir()
    curves.mkdir()
    card = json.loads((src / "minatar-breakout.json").read_text())
    params = (src / "minatar-breakout.msgpack").read_bytes()
    (shipped / "minatar-breakout.json").write_text(json.dumps(card))
    (shipped / "minatar-breakout.msgpack").write_bytes(params)
    worse = dict(card, eval=dict(card["eval"], mean_return=card["eval"]["mean_return"] - 1))
    _bundle(tmp_path / "minatar-breakout.tgz", "minatar-breakout", worse, params, [(10, 1.0)])
    msg = adopt(tmp_path / "minatar-breakout.tgz", shipped=shipped, curves=curves)
    assert "kept the shipped agent" in msg
    assert json.loads((shipped / "minatar-breakout.json").read_text()) == card
    better = dict(card, eval=dict(card["eval"], mean_return=card["eval"]["mean_return"] + 1))
    _bundle(tmp_path / "minatar-breakout.tgz", "minatar-breakout", better, params, [(10, 1.0), (20, 3.0)])
    msg = adopt(tmp_path / "minatar-breakout.tgz", shipped=shipped, curves=curves)
    assert msg.startswith("minatar-breakout: adopted")
    got = json.loads((shipped / "minatar-breakout.json").read_text())
    assert got["eval"]["mean_return"] == better["eval"]["mean_return"]
    rows = (curves / "minatar-breakout.csv").read_text().splitlines()
    assert rows[0] == "step,return,wall_s" and len(rows) == 3
    assert (curves / "minatar-breakout.png").exists()
    agent = jaxsal_agents.load(str(shipped / "minatar-breakout.json"))
    assert np.isfinite(np.asarray(agent.apply_fn(agent.params, np.zeros((1, 10, 10, 4))))).all()
