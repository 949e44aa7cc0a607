"""Example agents for jaxsal: Flax networks, EnvPool/gymnax environments, PQN training, shipped agents."""
from .collect import Batch, collect
from .errors import AgentInputError, AgentLoadError
from .zoo import Agent, available, build_model, load, random_agent

__all__ = ["Agent", "Batch", "collect", "AgentInputError", "AgentLoadError", "available", "build_model", "load",
           "random_agent"]
