"""Client-side transforms of an update (local DP, attacks, quantisation): the ``method.transforms`` list."""

from fedpeft.transforms.base import TRANSFORMS, UpdateTransform
from fedpeft.transforms import clip_delta, ldp, scale_delta  # noqa: F401  (registration)

__all__ = ["TRANSFORMS", "UpdateTransform"]
