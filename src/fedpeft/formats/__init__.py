"""Update formats: the innermost stage of every exchange, chosen by the local trainer (``LocalTrainer.update_format``).

A format says what one kind of update looks like on the wire: the instruction a client is sent and the tensors it
starts from, the reply it cuts from what it trained, and how the server checks and reads that reply. The trainer
keeps what is training (``fit``, ``evaluate``, ``diagnostics``) and returns its result in full; the format decides
what of it travels. ``base.TensorFormat``: the tensors themselves (every gradient trainer); ``base.NoUpdate``: nothing
(no local training); ``distribution.DistributionFormat``: a CMA-ES search distribution (FedBPT);
``token_indices.TokenIndexFormat``: one vocabulary id per prompt row (discrete prompt search, Alg. 4).
"""

from fedpeft.formats.base import NoUpdate, ReplyFormat, TensorFormat, UpdateFormat

__all__ = ["NoUpdate", "ReplyFormat", "TensorFormat", "UpdateFormat"]
