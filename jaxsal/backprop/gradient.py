"""Vanilla gradient dy/dx (Simonyan 2014) and gradient x input: specs of the single-backward
family (jaxsal.backprop.single_backward)."""
from __future__ import annotations

from jaxsal import engine
from jaxsal.backprop.single_backward import input_spec

gradient = engine.register(input_spec("gradient", (
    "Vanilla gradient dy/dx (Simonyan 2014), signed: (N, H, W) summed over frames or (N, H, W, C).")),
    module=__name__)
grad_x_input = engine.register(input_spec("grad_x_input", (
    "Gradient x input, x * dy/dx on the observation's own value scale, signed.")), module=__name__)
