"""Run a module with some of its weights replaced for one call: the clients' adapter tensors (LoRA's A and B, full
fine-tuning's weights, a client's pruned heads) enter the one shared frozen model this way.

The same function as ``torch.func.functional_call(module, tensors, ..., strict=False)`` (tied weights replaced
together, as its ``tie_weights``), without its per-call machinery: each name's slots (the parameter or buffer
dictionaries that hold it, all of a tied group) are looked up once per module and kept, and a call only assigns the
tensors into them and puts the originals back. With a few hundred LoRA tensors that machinery cost ~30 ms per
forward on SmolLM2, the better part of a GPU training step. A name the module does not have falls back to
``functional_call``.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

from fedpeft.lazy import lazy

torch = lazy("torch")

Slots = dict[str, list[tuple[dict, str]]]
_SLOTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _slots(module) -> Slots:
    """name -> every (store, key) holding that tensor: one for a plain weight, several for a tied group."""
    if module not in _SLOTS:
        holders: dict[int, list[tuple[dict, str]]] = {}
        names: dict[str, int] = {}
        for prefix, mod in module.named_modules(remove_duplicate=False):
            for store in (mod._parameters, mod._buffers):
                for key, value in store.items():
                    if value is None:
                        continue
                    holders.setdefault(id(value), []).append((store, key))
                    names[f"{prefix}.{key}" if prefix else key] = id(value)
        _SLOTS[module] = {name: holders[i] for name, i in names.items()}
    return _SLOTS[module]


def forget_slots() -> None:
    """Drop every kept lookup (a module whose structure changed, e.g. LoRA layers injected, is looked up again)."""
    _SLOTS.clear()


def call_with(module, tensors: dict[str, Any], *args, **kwargs):
    """``module(*args, **kwargs)`` with ``tensors`` (full dotted names) in place of its own weights for this call."""
    if not tensors:
        return module(*args, **kwargs)
    if any(name not in _slots(module) for name in tensors):
        return torch.func.functional_call(module, tensors, args=args, kwargs=kwargs, strict=False)
    with swapped(module, tensors):
        return module(*args, **kwargs)


@contextlib.contextmanager
def swapped(module, tensors: dict[str, Any]):
    """``tensors`` in place of ``module``'s own weights while inside (a forward and its backward, when activation
    checkpointing recomputes the forward during the backward)."""
    slots = _slots(module)
    missing = sorted(name for name in tensors if name not in slots)
    if missing:
        raise KeyError(f"{type(module).__name__} has no weights named {missing[:3]}")
    saved = []
    try:
        for name, value in tensors.items():
            for store, key in slots[name]:
                saved.append((store, key, store[key]))
                store[key] = value
        yield
    finally:
        for store, key, value in reversed(saved):
            store[key] = value
