"""What an honest node checks before it answers the server's unmask request (Bell et al., CCS 2020, §4 and App. E).

In SecAgg+'s last stage the server names, to each node, which of its neighbours survived (their private-mask seed
``b`` is asked for) and which dropped (their first secret key ``sk1`` is asked for, to rebuild the pairwise masks
they never removed). A server that names one node in both lists gets both of its secrets from each neighbour, takes
both masks off its masked vector and reads its update. Flower 1.41's ``secaggplus_mod`` answers such a request. The
paper's honest client answers only a consistent one:

- the two lists are disjoint, without repeats, and name only this node's neighbours (the nodes whose keys it was
  given in the key-sharing stage);
- it names this node itself among the survivors (a node that is unmasking has not dropped);
- a survivor is a neighbour whose shares this node holds, and so is a dropped node (``KeyError`` otherwise);
- at least the reconstruction threshold of survivors (Flower checks this too).

Flower's stage order already refuses a second unmask request in a round (the next stage must be setup). What one
node cannot see alone is a server that tells some neighbours "X survived" and the others "X dropped": the node
policy's majority threshold (``runtime.node_policy``) makes both halves too small to rebuild a secret. These are
pure functions of the node's protocol state and the request.
"""

from __future__ import annotations

from collections.abc import Collection


class DeviatingServer(ValueError):
    """The server's request departs from the protocol in a way that could reveal one node's update."""


def check_unmask(node: int, neighbours: Collection[int], held_b: Collection[int], held_sk1: Collection[int],
                 threshold: int, active: list[int], dead: list[int]) -> None:
    """Refuse (``DeviatingServer``) an unmask request that is not consistent: ``neighbours`` the nodes whose keys
    this node was given, ``held_b``/``held_sk1`` the owners of the shares it holds, ``active``/``dead`` the lists
    the server sent."""
    for name, ids in (("survivors", active), ("dropped nodes", dead)):
        if len(set(ids)) != len(ids):
            raise DeviatingServer(f"the unmask request names a node twice among the {name}: {sorted(ids)}")
        strangers = sorted(set(ids) - set(neighbours))
        if strangers:
            raise DeviatingServer(f"the unmask request names non-neighbours {strangers} among the {name}")
    both = sorted(set(active) & set(dead))
    if both:
        raise DeviatingServer(f"the unmask request names nodes {both} both as survivors and as dropped: their "
                              "updates would be revealed")
    if node not in active:
        raise DeviatingServer(f"the unmask request does not name this node ({node}) among the survivors")
    if len(active) < threshold:
        raise DeviatingServer(f"the unmask request names {len(active)} survivors, below the threshold {threshold}")
    missing = sorted((set(active) - set(held_b)) | (set(dead) - set(held_sk1)))
    if missing:
        raise DeviatingServer(f"the unmask request asks for shares of nodes {missing} this node never received")
