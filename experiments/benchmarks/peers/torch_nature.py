"""The Nature-CNN DQN in PyTorch with weights copied from a flax `jaxsal_agents.networks.NatureDQN`."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn


class TorchNatureDQN(nn.Module):
    """conv1 32@8x8/4, conv2 64@4x4/2, conv3 64@3x3/1, fc1 512, q; NCHW input on the 0-255 scale,
    scaled /255 inside like the flax model. ReLUs are modules so Captum's guided backprop and
    pytorch-grad-cam can hook them."""

    def __init__(self, num_actions: int, frames: int = 4):
        super().__init__()
        self.conv1 = nn.Conv2d(frames, 32, 8, 4)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(32, 64, 4, 2)
        self.relu2 = nn.ReLU()
        self.conv3 = nn.Conv2d(64, 64, 3, 1)
        self.relu3 = nn.ReLU()
        self.fc1 = nn.Linear(3136, 512)
        self.relu4 = nn.ReLU()
        self.q = nn.Linear(512, num_actions)

    def forward(self, x):
        x = x / 255.0
        x = self.relu1(self.conv1(x))
        x = self.relu2(self.conv2(x))
        x = self.relu3(self.conv3(x))
        x = self.relu4(self.fc1(x.flatten(1)))
        return self.q(x)


def from_flax(params, num_actions: int | None = None) -> TorchNatureDQN:
    """A TorchNatureDQN (eval mode, no parameter gradients) with the flax NatureDQN's weights.

    Conv kernels HWIO -> OIHW; fc1's rows are permuted from flax's (h, w, c) flatten order to
    torch's (c, h, w), so both models compute the same function of the same frames.
    """
    p = params["params"] if "params" in params else params
    if any(k.endswith("_norm") and p[k] for k in p):
        raise ValueError("only the NatureDQN without LayerNorm is mirrored in torch")
    a = num_actions or int(np.asarray(p["q"]["kernel"]).shape[1])
    frames = int(np.asarray(p["conv1"]["kernel"]).shape[2])
    m = TorchNatureDQN(a, frames)
    sd = {}
    for name in ("conv1", "conv2", "conv3"):
        sd[f"{name}.weight"] = np.asarray(p[name]["kernel"]).transpose(3, 2, 0, 1)
        sd[f"{name}.bias"] = np.asarray(p[name]["bias"])
    k = np.asarray(p["fc1"]["kernel"])                      # (7*7*64 in h,w,c order, 512)
    k = k.reshape(7, 7, 64, -1).transpose(2, 0, 1, 3).reshape(3136, -1)   # -> c,h,w order
    sd["fc1.weight"], sd["fc1.bias"] = k.T, np.asarray(p["fc1"]["bias"])
    sd["q.weight"], sd["q.bias"] = np.asarray(p["q"]["kernel"]).T, np.asarray(p["q"]["bias"])
    m.load_state_dict({k: torch.tensor(np.ascontiguousarray(v), dtype=torch.float32)
                       for k, v in sd.items()})
    for t in m.parameters():
        t.requires_grad_(False)
    return m.eval()


def to_nchw(obs_nhwc, device=None) -> torch.Tensor:
    """uint8/float NHWC frames -> float32 NCHW tensor on the 0-255 scale (on `device`, default CPU)."""
    x = torch.from_numpy(np.ascontiguousarray(np.asarray(obs_nhwc, np.float32).transpose(0, 3, 1, 2)))
    return x if device is None else x.to(device)
