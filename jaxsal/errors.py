"""One exception type for bad user input to jaxsal: a clear message, never a deep traceback."""


class SaliencyInputError(ValueError):
    """Bad observation, target, method, layer or option given to a saliency method."""
