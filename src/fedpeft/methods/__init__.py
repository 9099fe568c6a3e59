"""Methods: one generic composition of the four axes, and the papers' presets over it."""

from fedpeft.methods.base import PRESETS, ClientContext, Method, Preset, ReplySchema
from fedpeft.methods.compat import check_combination
from fedpeft.methods.composed import ComposedMethod
from fedpeft.methods import (  # noqa: F401  (registration)
    discrete_prompt, fedbpt, feddpo, fedit, fedpeptao, fedprompt, headprune, lora_family, zeroth_order)

__all__ = ["PRESETS", "ClientContext", "ComposedMethod", "Method", "Preset", "ReplySchema", "check_combination"]
