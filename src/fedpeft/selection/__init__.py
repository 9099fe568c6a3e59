"""Which clients train in a round (the client-selection axis)."""

from fedpeft.selection.base import SELECTORS, History, Selector, SelectorContext
from fedpeft.selection.uniform import select_clients
from fedpeft.selection import full, loss_difference, uniform  # noqa: F401  (registration)

__all__ = ["SELECTORS", "History", "Selector", "SelectorContext", "select_clients"]
