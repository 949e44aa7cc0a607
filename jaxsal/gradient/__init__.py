"""Gradient and CAM saliency methods (registered with jaxsal.explain)."""
__all__: list[str] = []
