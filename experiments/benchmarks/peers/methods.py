"""Peer saliency methods on a torch model: Captum where it has the method, pytorch-grad-cam's own
classes (or a hook version written exactly like it when the library does not import; see
TORCHVISION_STAND_IN for the one import it is helped past), and straightforward
batched torch versions of noise sensitivity and RISE (Captum has neither).

Every function takes (model, x NCHW float tensor on the 0-255 scale, **options), picks the
argmax action with one no-grad forward (what a user does to get Captum's `target`), and returns
a float tensor on x's device: maps (N, H, W) summed over the stacked frames, or the score grid
where noted (the model and the mask/blur tensors must be on that device too).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def chosen_actions(model, x):
    with torch.no_grad():
        return model(x).argmax(1)


def gradient(model, x):
    from captum.attr import Saliency
    return Saliency(model).attribute(x, target=chosen_actions(model, x), abs=False).sum(1)


def guided_backprop(model, x):
    from captum.attr import GuidedBackprop
    return GuidedBackprop(model).attribute(x, target=chosen_actions(model, x)).sum(1)


def integrated_gradients(model, x, steps: int = 32, internal_batch_size: int | None = 1024):
    from captum.attr import IntegratedGradients
    a = chosen_actions(model, x)
    att = IntegratedGradients(model).attribute(
        x, baselines=torch.zeros_like(x), target=a, n_steps=steps, method="riemann_right",
        internal_batch_size=internal_batch_size)
    return att.sum(1)


def gradcam_captum(model, x, layer: str = "conv3"):
    from captum.attr import LayerAttribution, LayerGradCam
    att = LayerGradCam(model, getattr(model, layer)).attribute(
        x, target=chosen_actions(model, x), relu_attributions=True)
    return LayerAttribution.interpolate(att, tuple(x.shape[2:]), "bilinear")[:, 0]


TORCHVISION_STAND_IN = ("pytorch-grad-cam imports torchvision in utilities its Grad-CAM path never calls "
                        "(torchvision.transforms in utils/image.py, torchvision in utils/model_targets.py); "
                        "where torchvision does not import (not installed, or a wheel built for another torch: "
                        "PyPI's does not load beside torch's CPU build), an empty stand-in module is put in its place at import, and calling anything "
                        "in it raises. The timed GradCAM / GradCAMPlusPlus code is the library's, unchanged.")


def _torchvision_stand_in():
    """Empty `torchvision`, `torchvision.transforms(.functional)` packages whose names raise when used."""
    import importlib.machinery
    import sys
    import types

    def unavailable(*a, **k):
        raise RuntimeError("torchvision is not installed: this is the benchmark's import-time stand-in")

    names = {"torchvision": (), "torchvision.ops": (), "torchvision.transforms": ("Compose", "Normalize", "ToTensor"),
             "torchvision.transforms.functional": ("resize",)}
    for name, attrs in names.items():
        m = types.ModuleType(name)
        m.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        m.__path__, m.__jaxsal_stand_in__ = [], True
        for a in attrs:
            setattr(m, a, unavailable)
        sys.modules.setdefault(name, m)
    for name in names:
        if "." in name:
            parent, _, child = name.rpartition(".")
            setattr(sys.modules[parent], child, sys.modules[name])


def _torchvision_loads() -> bool:
    """Whether torchvision imports (a wheel built for another torch fails at import: its partial
    modules are dropped so the stand-in can take their place)."""
    import sys
    if getattr(sys.modules.get("torchvision"), "__jaxsal_stand_in__", False):
        return False
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001 (missing, or 'operator torchvision::nms does not exist')
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        return False
    return True


def pytorch_grad_cam_status() -> str:
    """How pytorch-grad-cam imports here: its version, with "(torchvision stand-in)" when the
    stand-in was needed, or "does not import: ..." (the peers then use the hook version)."""
    if not _torchvision_loads():
        _torchvision_stand_in()
    try:
        import pytorch_grad_cam  # noqa: F401
        from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget  # noqa: F401
    except Exception as e:  # noqa: BLE001 (opencv/ttach missing: the hook version)
        return f"does not import: {type(e).__name__}: {str(e)[:120]}"
    import sys
    from importlib.metadata import version
    stand_in = getattr(sys.modules.get("torchvision"), "__jaxsal_stand_in__", False)
    return version("grad-cam") + (" (torchvision stand-in)" if stand_in else "")


def pytorch_grad_cam_available() -> bool:
    return not pytorch_grad_cam_status().startswith("does not import")


def _pgc(cls_name, model, x, layer):
    import pytorch_grad_cam
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget
    a = chosen_actions(model, x)
    x = x.detach().requires_grad_(True)  # the weights are frozen: the graph starts at the input
    with getattr(pytorch_grad_cam, cls_name)(model=model, target_layers=[getattr(model, layer)]) as cam:
        out = cam(input_tensor=x, targets=[ClassifierOutputTarget(int(i)) for i in a])
    return torch.from_numpy(out)


def _hook_cam(model, x, layer, plus_plus: bool):
    """pytorch-grad-cam's computation with plain hooks: activations and gradients of the target
    layer's output for the sum of the chosen-action scores; Grad-CAM weights mean_ij g, Grad-CAM++
    weights sum_ij ReLU(g) g^2 / (2 g^2 + sum_ab A g^3); ReLU(sum_k w_k A^k), min-max scaled per
    map, bilinearly resized to the input."""
    a = chosen_actions(model, x)
    store = {}
    mod = getattr(model, layer)
    h = mod.register_forward_hook(lambda m, i, o: store.__setitem__("A", o))
    try:
        x = x.detach().requires_grad_(True)  # graph from the input (the model's weights are frozen)
        out = model(x)
        A = store["A"]
        g, = torch.autograd.grad(out.gather(1, a[:, None]).sum(), A)
    finally:
        h.remove()
    A = A.detach()
    if plus_plus:
        g2 = g * g
        g3 = g2 * g
        aij = g2 / (2 * g2 + A.sum((2, 3), keepdim=True) * g3 + 1e-7)
        aij = torch.where(g != 0, aij, torch.zeros_like(aij))
        w = (torch.relu(g) * aij).sum((2, 3))
    else:
        w = g.mean((2, 3))
    cam = torch.relu((w[:, :, None, None] * A).sum(1))
    flat = cam.flatten(1)
    cam = (cam - flat.min(1).values[:, None, None]) / (1e-7 + (flat.max(1).values - flat.min(1).values)[:, None, None])
    return F.interpolate(cam[:, None], size=tuple(x.shape[2:]), mode="bilinear", align_corners=False)[:, 0]


def gradcam(model, x, layer: str = "conv3"):
    if pytorch_grad_cam_available():
        return _pgc("GradCAM", model, x, layer)
    return _hook_cam(model, x, layer, plus_plus=False)


def gradcam_pp(model, x, layer: str = "conv3"):
    if pytorch_grad_cam_available():
        return _pgc("GradCAMPlusPlus", model, x, layer)
    return _hook_cam(model, x, layer, plus_plus=True)


def occlusion(model, x, patch: int = 2, stride: int = 2, perturbations_per_eval: int = 256,
              return_grid: bool = False):
    """Captum Occlusion with Paper B's parameters: black patch over all frames. Captum's map is
    t(x) - t(x') spread over the patch (the "drop" score); return_grid gives the per-patch grid."""
    from captum.attr import Occlusion
    c = x.shape[1]
    att = Occlusion(model).attribute(
        x, sliding_window_shapes=(c, patch, patch), strides=(c, stride, stride), baselines=0,
        target=chosen_actions(model, x), perturbations_per_eval=perturbations_per_eval)
    att = att[:, 0]
    return att[:, ::stride, ::stride] if return_grid else att


def noise_sensitivity(model, x, masks, bh, bw, grid_shape, chunk: int = 4096,
                      return_grid: bool = False):
    """Batched torch noise sensitivity (Greydanus/Paper B): x' = x (1 - M) + blur(x) M for every
    mask M (K, H, W), score 1 - softmax(Q(x'))_a; masks and blur matrices are given (the same
    ones jaxsal builds, K = gy * gx). Grid (N, gy, gx) resized bilinearly unless return_grid."""
    n, c, h, w = x.shape
    k = masks.shape[0]
    a = chosen_actions(model, x)
    blurred = torch.einsum("hi,ncij,wj->nchw", bh, x, bw)
    scores = torch.empty(n, k, device=x.device)
    per = max(1, chunk // k)  # states per forward
    with torch.no_grad():
        for s in range(0, n, per):
            xs, bs = x[s:s + per], blurred[s:s + per]
            m = masks[None, :, None]                              # (1, K, 1, H, W)
            xp = xs[:, None] * (1 - m) + bs[:, None] * m          # (S, K, C, H, W)
            q = model(xp.reshape(-1, c, h, w))
            p = torch.softmax(q, 1).gather(1, a[s:s + per].repeat_interleave(k)[:, None])[:, 0]
            scores[s:s + per] = 1 - p.reshape(-1, k)
    grid = scores.reshape(n, *grid_shape)
    if return_grid:
        return grid
    return F.interpolate(grid[:, None], size=(h, w), mode="bilinear", align_corners=False)[:, 0]


def rise(model, x, masks, p_keep: float = 0.5, chunk: int = 4096):
    """Batched torch RISE: S = sum_i Q_a(x M_i) M_i / (n p_keep) with the given masks (n, H, W)."""
    n, c, h, w = x.shape
    m = masks.shape[0]
    a = chosen_actions(model, x)
    out = torch.empty(n, h * w, device=x.device)
    flat = masks.reshape(m, h * w)
    with torch.no_grad():
        for s in range(n):
            sc = torch.empty(m, device=x.device)
            for j in range(0, m, chunk):
                mk = masks[j:j + chunk]
                q = model(x[s:s + 1] * mk[:, None])
                sc[j:j + chunk] = q[:, a[s]]
            out[s] = sc @ flat
    return (out / (m * p_keep)).reshape(n, h, w)
