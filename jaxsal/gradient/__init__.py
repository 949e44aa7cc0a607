"""Gradient and CAM saliency methods (registered with jaxsal.explain)."""
from jaxsal.gradient.family import (g1gradcam, g2gradcam, gradcam, gradcam_pp, guided_gradcam,
                                    register_cam)
from jaxsal.gradient.guided import deconvnet, guided_backprop
from jaxsal.gradient.layers import layer_calls
from jaxsal.gradient.rules import with_rule
from jaxsal.gradient.vanilla import grad_x_input, gradient, integrated_gradients, smoothgrad
from jaxsal.gradient.xgradcam import xgradcam  # one CAM-table row (registers "xgradcam")

__all__ = ["gradient", "grad_x_input", "smoothgrad", "integrated_gradients", "guided_backprop",
           "deconvnet", "gradcam", "gradcam_pp", "g1gradcam", "g2gradcam", "guided_gradcam",
           "xgradcam", "with_rule", "layer_calls", "register_cam"]
