"""Method presets composing the four axes; ``PRESETS`` lists them."""

from fedpeft.methods.base import PRESETS, ClientContext, Method, Preset, ReplySchema
from fedpeft.methods import fedbpt, fedpeptao, presets  # noqa: F401  (registration)

__all__ = ["PRESETS", "ClientContext", "Method", "Preset", "ReplySchema"]
