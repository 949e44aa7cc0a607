"""Errors raised for bad user input: one clear message, no deep JAX traceback."""


class AgentInputError(ValueError):
    """Bad observation shape/dtype/layout for an agent network."""


class AgentLoadError(ValueError):
    """Unknown agent name, missing, corrupt or mismatched parameter file."""
