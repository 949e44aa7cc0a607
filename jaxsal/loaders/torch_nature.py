"""Nature-CNN torch `state_dict`s of CleanRL and Stable-Baselines3 Atari agents, as Flax agents.

Read with `torch.load(..., weights_only=True)` only (tensors and plain containers, never
arbitrary objects); torch is an optional extra (`pip install 'jaxsal[torch]'`). Recognised
key sets: CleanRL `dqn_atari.py` (network.0..9), CleanRL PPO Atari (network.*, actor, critic),
SB3 DQN (q_net.features_extractor.*, q_net.q_net.0), SB3 PPO/A2C (features_extractor.*,
action_net, value_net); an SB3 `.zip` is opened for its `policy.pth`.
"""
from __future__ import annotations

import io
import pickle
import re
import zipfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxsal.agent_spec import DeclaredFn, LoadedAgent
from jaxsal.loaders.errors import LoaderError, check_params, read_bytes, read_zip_member
from jaxsal.loaders.nets import TorchNatureCNN

PTH_MAX = 1 << 30  # bytes of an SB3 zip's policy.pth (a Nature-CNN agent's: ~7 MB)
# (conv1, conv2, conv3, fc1) prefixes, then the head: ("q", prefix) or ("ac", actor, critic)
FORMATS = {
    "cleanrl dqn_atari": (("network.0", "network.2", "network.4", "network.7"), ("q", "network.9")),
    "cleanrl ppo_atari": (("network.0", "network.2", "network.4", "network.7"), ("ac", "actor", "critic")),
    "sb3 dqn": (tuple(f"q_net.features_extractor.{k}" for k in ("cnn.0", "cnn.2", "cnn.4", "linear.0")),
                ("q", "q_net.q_net.0")),
    "sb3 actor-critic": (tuple(f"features_extractor.{k}" for k in ("cnn.0", "cnn.2", "cnn.4", "linear.0")),
                         ("ac", "action_net", "value_net")),
}


TORCH_FLOOR = (2, 10)  # torch <= 2.5.1 runs code past weights_only=True (CVE-2025-32434); < 2.10 has CVE-2026-24747
TORCH_FIX = "pip install 'torch>=2.10'"


def check_torch_version(version: str):
    """Refuse a torch whose weights-only unpickler a crafted checkpoint can get past to run code:
    releases before 2.10 (and pre-releases of 2.10 itself)."""
    m = re.match(r"(\d+)\.(\d+)(?:\.\d+)?([^+]*)", str(version))
    ok = m is not None and ((int(m.group(1)), int(m.group(2))) > TORCH_FLOOR or (
        (int(m.group(1)), int(m.group(2))) == TORCH_FLOOR and not re.search(r"(a|b|rc|dev)\d*", m.group(3))))
    if not ok:
        raise LoaderError(f"torch {version} is installed, and a crafted checkpoint can run code in torch before "
                          f"2.10 even with weights_only=True (CVE-2025-32434, CVE-2026-24747); jaxsal reads torch "
                          f"checkpoints only with torch 2.10 or newer: {TORCH_FIX}")


def _refusal(path, e: Exception) -> str:
    """One line for a checkpoint torch's weights-only unpickler refused: what it met (the global it
    names, when it does) and the fix, never torch's advice to retry with weights_only=False or to
    allowlist the global (either runs whatever code the file holds). A file torch cannot read at all
    (cut off, damaged: its zip reader or a storage's size fails) is said to be that."""
    what = re.search(r"Unsupported (?:global|operand)\W{0,3}(?:GLOBAL )?[\w.]{1,120}"
                     r"|unsupported GLOBAL [\w.]{1,120} whose module [\w.]{1,120} is blocked", str(e))
    if what is None and not isinstance(e, pickle.UnpicklingError):
        why = str(e).splitlines()[0] if str(e) else ""
        why = why if len(why) <= 120 else why[:120].rsplit(" ", 1)[0] + " ..."
        return (f"{path}: torch cannot read it as a checkpoint ({type(e).__name__}: {why}): the file is corrupt or "
                "crafted (cut off, or changed after it was saved), get it again from where it was made")
    met = f" ({what.group(0).rstrip('.')})" if what else f" ({type(e).__name__})"
    return (f"{path}: not a torch state_dict of tensors and plain containers{met}; jaxsal reads torch files only "
            "with weights_only=True and never unpickles other objects: load the checkpoint where it was made and "
            "save only its state_dict (torch.save(model.state_dict(), path))")


def load_state_dict(path) -> dict:
    """{name: float32 numpy array} from a torch state_dict file or an SB3 model .zip."""
    data = read_bytes(path)
    if zipfile.is_zipfile(io.BytesIO(data)):
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                names = z.namelist()
                if "policy.pth" in names:  # Stable-Baselines3 model archive
                    data = read_zip_member(z, "policy.pth", path, PTH_MAX)
                elif "data" in names:  # SB3's JSON settings, but no weights (torch's own zips hold DIR/data.pkl)
                    raise LoaderError(f"{path}: a Stable-Baselines3 .zip without its policy.pth (it holds "
                                      f"{', '.join(names[:6])}): the file is incomplete, save the model again with "
                                      "model.save(path)")
        except zipfile.BadZipFile as e:
            raise LoaderError(f"cannot read {path}: not a valid .zip ({e})") from None
    try:
        import torch
    except ImportError:
        raise LoaderError(f"{path} is a torch checkpoint: install torch (pip install 'jaxsal[torch]') "
                          "to convert it") from None
    check_torch_version(torch.__version__)
    try:
        sd = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:  # weights_only refuses anything but tensors and plain containers
        raise LoaderError(_refusal(path, e)) from None
    if not isinstance(sd, dict) or not all(type(k) is str and hasattr(v, "detach") for k, v in sd.items()):
        raise LoaderError(f"{path}: expected a state_dict (name -> tensor); save model.state_dict()")
    for k, v in sd.items():  # .numpy() fails on these, and .float() drops a complex tensor's imaginary part
        if v.layout != torch.strided or v.is_meta or v.is_complex() or v.is_quantized:
            kind = "complex" if v.is_complex() else "meta" if v.is_meta else "quantized" if v.is_quantized else v.layout
            raise LoaderError(f"{path}: tensor {k!r} is {kind}, not a dense real tensor; save model.state_dict() of "
                              "the trained (float) model")
    # floating point as float32; integer and bool tensors as they are, so a weight of them is refused (check_params)
    return {k: (v.detach().float() if v.is_floating_point() else v.detach()).cpu().numpy() for k, v in sd.items()}


def detect(sd: dict) -> str:
    for name, (trunk, head) in FORMATS.items():
        keys = [f"{p}.weight" for p in trunk + head[1:]]
        if all(k in sd for k in keys):
            return name
    raise LoaderError("state_dict keys match no known Nature-CNN agent (CleanRL dqn_atari / ppo_atari, "
                      f"SB3 DQN / PPO / A2C); first keys: {', '.join(list(sd)[:6])}")


def _ndim(sd, key, n, where):
    if np.ndim(sd[key]) != n:
        raise LoaderError(f"{where}: {key} has shape {tuple(np.shape(sd[key]))}, not {n}-dimensional: "
                          "it is no Nature CNN's")


def _conv(sd, p, where):
    _ndim(sd, f"{p}.weight", 4, where)
    return {"kernel": jnp.asarray(np.transpose(sd[f"{p}.weight"], (2, 3, 1, 0))), "bias": jnp.asarray(sd[f"{p}.bias"])}


def _dense(sd, p, where):
    _ndim(sd, f"{p}.weight", 2, where)
    return {"kernel": jnp.asarray(sd[f"{p}.weight"].T), "bias": jnp.asarray(sd[f"{p}.bias"])}


def convert(sd: dict, fmt: str | None = None, where: str = "state_dict") -> tuple[TorchNatureCNN, dict, str]:
    """(flax module, flax params, format name) for a Nature-CNN state_dict (read from `where`)."""
    try:
        fmt = fmt or detect(sd)
    except LoaderError as e:
        raise LoaderError(f"{where}: {e}") from None
    (c1, c2, c3, fc), head = FORMATS[fmt]
    try:
        p = {"conv1": _conv(sd, c1, where), "conv2": _conv(sd, c2, where), "conv3": _conv(sd, c3, where),
             "fc1": _dense(sd, fc, where)}
        if head[0] == "q":
            p["q"] = _dense(sd, head[1], where)
            n = int(p["q"]["kernel"].shape[1])
            module = TorchNatureCNN(n, "q")
        else:
            p["logits"], p["value"] = _dense(sd, head[1], where), _dense(sd, head[2], where)
            n = int(p["logits"]["kernel"].shape[1])
            module = TorchNatureCNN(n, "actor_critic")
    except KeyError as e:
        raise LoaderError(f"{where}: state_dict of format {fmt!r} lacks {e.args[0]}") from None
    c = int(p["conv1"]["kernel"].shape[2])
    if n < 1 or c < 1:  # the network's initialisers would divide by zero
        raise LoaderError(f"{where}: state_dict {fmt!r} gives a network of {n} actions on {c} input channels; the "
                          "file is corrupt, get it again from where it was made")
    if p["conv1"]["kernel"].shape[:2] != (8, 8) or p["fc1"]["kernel"].shape[0] != 3136:
        raise LoaderError(f"{where}: state_dict {fmt!r} is not a Nature CNN on 84x84 frames (conv1 "
                          f"{p['conv1']['kernel'].shape}, fc1 {p['fc1']['kernel'].shape})")
    want = jax.eval_shape(module.init, jax.random.PRNGKey(0), jax.ShapeDtypeStruct((1, c, 84, 84), jnp.float32))
    check_params(where, {"params": p}, want, f"the {fmt} Nature CNN")
    return module, {"params": p}, fmt


def torch_nature(path, name: str | None = None, fmt: str | None = None) -> LoadedAgent:
    """A CleanRL or SB3 Nature-CNN torch checkpoint as a Flax agent on (N, C, 84, 84) uint8 frames.

    Read with torch's weights-only unpickler (torch 2.10 or newer, the optional `torch` extra):
    a state_dict of tensors and plain containers, or an SB3 model `.zip`'s `policy.pth`.
    Q-networks give Q-values (N, A); actor-critics `{"logits": (N, A), "value": (N,)}`.

    Args:
        path (str | os.PathLike): the `.pth`/`.pt` state_dict or the SB3 `.zip`.
        name (str | None): the agent's name; None: the file's stem.
        fmt (str | None): the state_dict's format: "cleanrl dqn_atari", "cleanrl ppo_atari",
            "sb3 dqn" or "sb3 actor-critic" (SB3 PPO and A2C); None detects it from the keys.

    Returns:
        jaxsal.agent_spec.LoadedAgent: `apply_fn`, `params`, `layout` "NCHW", `num_actions`,
            `pixels` "uint8" and a `card` naming the format.

    Raises:
        jaxsal.loaders.LoaderError: (a `jaxsal.SaliencyInputError`) the file is missing or
            unreadable; torch is missing or older than 2.10; the file holds more than tensors and
            plain containers (dense real tensors); or its keys or shapes are no known Nature CNN on 84x84
            frames; or a weight holds NaN or infinite values.
    """
    module, params, fmt = convert(load_state_dict(path), fmt, str(path))
    c = int(params["params"]["conv1"]["kernel"].shape[2])
    return LoadedAgent(name=name or Path(path).stem, apply_fn=DeclaredFn(module.apply, "NCHW", "uint8"),
                       params=params, layout="NCHW", num_actions=module.num_actions, pixels="uint8",
                       card={"source": f"torch state_dict ({fmt})", "file": str(path),
                             "num_actions": module.num_actions, "obs_shape": [c, 84, 84]})
