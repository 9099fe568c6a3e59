"""Classification readouts (the ``model.readout`` axis): similarity, verbalizer, linear; one file each."""

from fedpeft.model.readouts import linear, similarity, verbalizer  # noqa: F401  (registration)
from fedpeft.model.readouts.base import READOUTS, Readout, mean_pool, pooling_mask
from fedpeft.model.readouts.verbalizer import label_token_ids

__all__ = ["READOUTS", "Readout", "label_token_ids", "mean_pool", "pooling_mask"]
