"""Personalisation after federated training (the post-tuning axis): each evaluated client adapts the global
tensors on a few shots of its own data before it is scored."""

from fedpeft.post_tuning.base import POST_TUNING, PostTuningBase, PostTuningContext
from fedpeft.post_tuning import bbt, gradient  # noqa: F401  (registration)

__all__ = ["POST_TUNING", "PostTuningBase", "PostTuningContext"]
