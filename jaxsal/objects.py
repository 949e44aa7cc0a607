"""Deprecated: the old name of `jaxsal.game_objects` (ground-truth game objects from Atari RAM).

Importing it warns and gives the same public names; import `jaxsal.game_objects` instead.
"""
import warnings

from jaxsal import game_objects as _game_objects
from jaxsal.game_objects import *  # noqa: F401,F403

__all__ = list(_game_objects.__all__)

warnings.warn("jaxsal.objects is now jaxsal.game_objects: import it from there (the old name goes in a later "
              "release)", DeprecationWarning, stacklevel=2)
