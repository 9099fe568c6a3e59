"""The round's exchange as an ordered list of stages (``method.exchange``; ``method.sharing: X`` is ``[X]``).

A stage is a registered sharing policy (``sharing``): what a client is sent and starts from, what it trains and
uploads, how the server checks and expands a reply and what it does after aggregation, with a capability record
(``exchange.capabilities``). ``exchange.stages`` builds a method's stages and decides from their records whether a
chain can run; ``exchange.pipeline`` runs a chain as one policy; ``exchange.aggregation_error`` measures how far
what the server broadcasts is from the exact average of the clients' LoRA products. The innermost stage is the
trainer's update format (``fedpeft.formats``): what its kind of update looks like on the wire.
"""
