"""One vocabulary id per prompt row as the exchanged update (personalised gradient-free prompt search, Alg. 4).

A row the local search changed equals a token embedding e(c) and travels as c; a row left as received travels as
the sentinel |V| (``fedpeft.comm.token_index``): T x 16 bits. The server decodes a reply against the prompt it
sent, and rejects an index above the sentinel or a special token's (which the search never picks). ``rows``
sends the decoded rows instead (T x d floats, the same prompt), whose weighted mean secure aggregation can sum.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from fedpeft.comm.codec import Message
from fedpeft.comm.token_index import decode_tokens, encode_tokens, index_dtype
from fedpeft.comm.update import Params, Update
from fedpeft.formats.base import ReplyFormat, Shapes, TensorFormat
from fedpeft.lazy import lazy

torch = lazy("torch")

PROMPT, TOKENS = "prompt", "tokens"
TOKEN_IDS, CHANGED = "token_ids", "changed"  # what the search returns beside the prompt: ids [T], changed [T]


class TokenIndexFormat(TensorFormat):
    """The prompt's tensors down; its token indices (or, with ``rows``, its rows) up. ``vocabulary`` gives e(V)
    (``table``, float32 [|V|, d]) and its special ids (``special``), built when first needed."""

    def __init__(self, upload: Literal["indices", "rows"], vocabulary: Callable[[], Any]) -> None:
        self.upload_as, self.vocabulary = upload, vocabulary

    def upload(self, update: Update, received: Params) -> Update:
        """Alg. 4 Encode_Upload from the searched prompt's token ids and changed rows (or the rows themselves); none
        where the prompt is kept private (local-only)."""
        aux = update.aux_tensors
        if self.upload_as == "rows" or PROMPT not in received:
            tensors = {PROMPT: update.tensors[PROMPT]}
        else:
            tensors = {TOKENS: encode_tokens(aux[TOKEN_IDS], aux[CHANGED], self.vocabulary().table.shape[0])}
        rest = {k: v for k, v in aux.items() if k not in (TOKEN_IDS, CHANGED)}
        return Update(update.client, tensors, update.weight, rest, update.scalars)

    def reply(self, shared: Shapes) -> ReplyFormat:
        if PROMPT not in shared:
            return ReplyFormat({})  # kept private (local-only): nothing goes up
        if self.upload_as == "rows":
            return ReplyFormat({PROMPT: tuple(shared[PROMPT])})
        return ReplyFormat({TOKENS: (shared[PROMPT][0],)}, {},
                           {TOKENS: index_dtype(self.vocabulary().table.shape[0])})

    def check(self, reply: Message) -> None:
        if self.upload_as == "rows" or TOKENS not in reply.tensors:
            return  # the schema fixed the shape; non-finite rows are rejected with every float reply
        vocab = self.vocabulary()
        size = vocab.table.shape[0]
        idx = reply.tensors[TOKENS].long()
        if int(idx.max()) > size:
            raise ValueError(f"'{TOKENS}' holds an index above the sentinel {size}")
        if bool(torch.isin(idx, vocab.special).any()):
            raise ValueError(f"'{TOKENS}' holds a special-token id, which the search never picks")

    def decode(self, update: Update, shared: Params) -> Update:
        """Rows of the sender's prompt: e(V)[index], or the prompt the server sent for the sentinel."""
        if self.upload_as == "rows" or TOKENS not in update.tensors:
            return update
        prompt = decode_tokens(update.tensors[TOKENS], shared[PROMPT].float(), self.vocabulary().table)
        return update.with_tensors({PROMPT: prompt})
