"""Gradient and CAM saliency methods (registered with jaxsal.explain), specs of jaxsal.engine.

Each module registers its own methods (`jaxsal.registry.discover` imports every module here, so a
new method's file needs no line below); the imports give the public functions (`jaxsal.gradcam`)."""
from jaxsal.backprop.single_backward import (g1gradcam, g2gradcam, gradcam, gradcam_pp, guided_gradcam,
                                             register_cam)
from jaxsal.backprop.gradient import grad_x_input, gradient
from jaxsal.backprop.guided import deconvnet, guided_backprop
from jaxsal.backprop.integrated_gradients import integrated_gradients
from jaxsal.backprop.layers import layer_calls
from jaxsal.backprop.rules import with_rule
from jaxsal.backprop.smoothgrad import smoothgrad
from jaxsal.backprop.xgradcam import xgradcam

__all__ = ["gradient", "grad_x_input", "smoothgrad", "integrated_gradients", "guided_backprop",
           "deconvnet", "gradcam", "gradcam_pp", "g1gradcam", "g2gradcam", "guided_gradcam",
           "xgradcam", "with_rule", "layer_calls", "register_cam"]
