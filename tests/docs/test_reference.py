"""docs/reference.md's options table against the one description of each option: the docstrings of
``hvd_mlflow.config.Options`` and ``AutologOptions``. A new option that is not documented fails here."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from hvd_mlflow.config import ENV_PREFIX, AutologOptions, Options

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference.md"
pytestmark = pytest.mark.docs


def rows() -> dict[str, str]:
    """option name -> its row in the reference's options table."""
    return {m.group(1): m.group(0) for m in re.finditer(r"^\| `(\w+)`[^\n]*$", REFERENCE.read_text(), re.M)}


def test_every_option_is_documented_once_in_the_docstring_and_the_reference_table():
    table = rows()
    for option in dataclasses.fields(AutologOptions):
        row = table.get(option.name)
        assert row is not None, f"docs/reference.md has no row for option {option.name}"
        assert f"`{ENV_PREFIX}{option.name.upper()}`" in row, option.name
        autolog_only = option.name not in {f.name for f in dataclasses.fields(Options)}
        assert ("autolog only" in row) == autolog_only, option.name
        doc = (AutologOptions.__doc__ if autolog_only else Options.__doc__) or ""
        assert re.search(rf"^\s+{option.name}: ", doc, re.M), f"the docstring does not describe {option.name}"
    documented = {name for name in table if name in {f.name for f in dataclasses.fields(AutologOptions)}}
    assert documented == {f.name for f in dataclasses.fields(AutologOptions)}
