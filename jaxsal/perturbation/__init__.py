"""Perturbation saliency methods (registered with jaxsal.explain): occlusion, noise sensitivity,
RISE, LIME, SARFA and Score-CAM (masks from a layer's activations), batched over states x
perturbations on device.

Each module registers its own methods (`jaxsal.registry.discover` imports every module here, so a
new method's file needs no line below); the imports give the public functions (`jaxsal.occlusion`)."""
from jaxsal.perturbation.lime import lime, lime_samples, segment  # noqa: F401
from jaxsal.perturbation.noise import noise_sensitivity
from jaxsal.perturbation.occlusion import occlusion
from jaxsal.perturbation.rise import rise, rise_masks
from jaxsal.perturbation.sarfa import sarfa, sarfa_score  # noqa: F401
from jaxsal.perturbation.scorecam import scorecam

__all__ = ["occlusion", "noise_sensitivity", "rise", "rise_masks", "lime", "sarfa", "scorecam"]
