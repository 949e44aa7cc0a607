"""Gradient and CAM saliency methods (registered with jaxsal.explain), specs of jaxsal.engine."""
from jaxsal.backprop.single_backward import (g1gradcam, g2gradcam, gradcam, gradcam_pp, guided_gradcam,
                                             register_cam)
from jaxsal.backprop.gradient import grad_x_input, gradient
from jaxsal.backprop.guided import deconvnet, guided_backprop
from jaxsal.backprop.integrated_gradients import integrated_gradients
from jaxsal.backprop.layers import layer_calls
from jaxsal.backprop.rules import with_rule
from jaxsal.backprop.smoothgrad import smoothgrad
from jaxsal.backprop.xgradcam import xgradcam  # one CAM-table row (registers "xgradcam")

__all__ = ["gradient", "grad_x_input", "smoothgrad", "integrated_gradients", "guided_backprop",
           "deconvnet", "gradcam", "gradcam_pp", "g1gradcam", "g2gradcam", "guided_gradcam",
           "xgradcam", "with_rule", "layer_calls", "register_cam"]
