"""Every registered component, on every axis: it has a row in the table (``cases.py``), its settings validate with
that row, its settings model documents every field, and it describes itself for ``fedpeft components``."""

from __future__ import annotations

import pytest

from tests.conformance.cases import LEAST, REGISTRIES, least, registered


@pytest.mark.parametrize("axis, name", registered())
def test_settings_validate_and_document_every_field(axis, name):
    entry = REGISTRIES[axis].entry(name)
    row = least(axis, name)
    assert entry.description, f"{axis} '{name}' is registered without a description"
    if entry.settings is None:
        assert row == {}, f"{axis} '{name}' takes no settings; its row must be empty"
        return
    entry.settings.model_validate(row)
    undocumented = [k for k, f in entry.settings.model_fields.items() if not f.description]
    assert not undocumented, f"{entry.settings.__name__}: fields without description=: {undocumented}"
    with pytest.raises(ValueError):  # settings models forbid unknown keys, so typos fail when the config loads
        entry.settings.model_validate(row | {"no_such_setting": 1})


def test_every_row_names_a_registered_component():
    stale = [(axis, name) for axis, rows in LEAST.items() for name in rows if name not in REGISTRIES[axis]]
    assert not stale, f"rows of components no longer registered (remove them from cases.py): {stale}"
