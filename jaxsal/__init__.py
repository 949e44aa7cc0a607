"""jaxsal: fast, batched saliency maps for deep RL agents, as pure JAX functions.

    import jaxsal
    maps = jaxsal.explain(apply_fn, params, obs, method="gradcam", layer="conv3")

Every method takes `apply_fn(params, obs)` (any pure JAX function, any output pytree).
Gradient and CAM methods live in `jaxsal.backprop` (methods computed by backpropagation),
perturbation methods in `jaxsal.perturbation`; all register with the one front door
`jaxsal.explain`, and each is also a function of its own name (`jaxsal.gradcam(...)`).
"""
from jaxsal import cpu
cpu.auto()  # XLA:CPU's YNNPACK kernels, before JAX starts (JAXSAL_FAST_CPU=0 opts out)
from jaxsal import targets  # noqa: E402
from jaxsal.errors import SaliencyInputError  # noqa: E402
from jaxsal.front import explain, register  # noqa: E402  (register: add a method)
from jaxsal.engine import noise_tunnel, path_integral  # noqa: E402  (SmoothGrad / IG of any gradient or CAM method)
from jaxsal.backprop import *  # noqa: F401,F403  (the gradient/CAM methods' functions; layer_calls)
from jaxsal.perturbation import *  # noqa: F401,F403  (the perturbation methods' functions)
from jaxsal import registry  # noqa: E402
from jaxsal.registry import METHODS, unregister  # noqa: E402
from jaxsal.provenance import params_checksum  # noqa: E402  (stable sha256 of params)
from jaxsal.io.store import load_maps, load_outputs  # chunked maps and outputs written by `jaxsal explain`
from jaxsal.io.object_files import load_object_effects, load_object_shares  # noqa: E402  (of `explain --objects`)
from jaxsal.io.sweep import load_sweep  # noqa: E402  the table of `jaxsal sweep` (one row per cell)
from jaxsal import metrics  # noqa: E402  sanity checks, insertion/deletion (jaxsal.metrics)

from jaxsal.registry import method_options, options_table  # noqa: E402
from jaxsal.caching import clear_caches  # noqa: E402  (empty every bounded jaxsal cache)
from jaxsal import loaders  # noqa: E402,F401  (agents trained elsewhere: CleanRL, SB3, flax msgpack)

__version__ = "0.2.0.dev0"


def methods() -> list[str]:
    """Names of all methods accepted by `jaxsal.explain`, sorted.

    Returns:
        list[str]: the registered method names (`jaxsal.method_options(name)` gives each one's options).
    """
    return sorted(METHODS)


def cam_methods() -> list[str]:
    """Names of the CAM variants (methods taking `layer=`; add one with `jaxsal.register_cam`), sorted.

    Returns:
        list[str]: the registered CAM variant names.
    """
    from jaxsal.backprop.cam import CAMS
    return sorted(CAMS)


registry.discover()  # last: every module of backprop/ and perturbation/ registers its methods (shipped)
