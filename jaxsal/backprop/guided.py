"""Guided backpropagation (Springenberg 2015) and deconvnet: input gradients through rewritten ReLUs.

Guided: R_in = 1[x > 0] 1[R_out > 0] R_out at every ReLU; deconvnet: R_in = 1[R_out > 0] R_out.
The rules act on any apply_fn via `jaxsal.backprop.rules.with_rule`. Signed maps.
"""
from __future__ import annotations

from jaxsal import engine
from jaxsal.backprop.single_backward import input_spec

guided_backprop = engine.register(input_spec("guided_backprop", (
    "Guided-backprop input attributions: (N, H, W) summed over frames, or (N, H, W, C).")), module=__name__)
deconvnet = engine.register(input_spec("deconvnet", (
    "Deconvnet input attributions: (N, H, W) summed over frames, or (N, H, W, C).")), module=__name__)
