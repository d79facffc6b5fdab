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


def test_every_tag_and_module_the_docs_name_exists():
    """A `hvd_mlflow.<name>` in README.md or docs/ is a tag the code writes (a string literal in hvd_mlflow/) where
    its line speaks of tags, else a module of the package or an attribute of one: a moved module or a renamed tag
    cannot leave the docs naming what is gone (the layout move once turned the tag `hvd_mlflow.keras_flavour` into
    the module path `hvd_mlflow.every_rank.keras_flavour` in four places)."""
    import importlib

    root = REFERENCE.parents[1]
    code = "".join(p.read_text() for p in (root / "hvd_mlflow").rglob("*.py"))
    missing = []
    for doc in [root / "README.md", *(root / "docs").glob("*.md")]:
        for line in doc.read_text().splitlines():
            for name in re.findall(r"`(hvd_mlflow(?:\.[A-Za-z_]\w*)+)`", line):
                if f'"{name}"' in code:  # a tag (or a logger's name) the code writes
                    continue
                if "tag" in line or not _importable(importlib, name):
                    missing.append(f"{doc.name}: {name}")
    assert missing == []


def _importable(importlib, name: str) -> bool:
    """Whether ``name`` is a module of the package, or an attribute of its longest importable prefix."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


README = REFERENCE.parents[1] / "README.md"


def test_the_readme_lists_every_option_and_which_are_autolog_only():
    """README's "Options and docs" names every option once, the callback's first, then after "autolog only" those
    of ``autolog()`` alone: a new option, or one that moves between them, cannot leave the list behind (it once
    lacked the three TensorBoard options and ``allow_world_of_one``, and called ``guard_other_ranks`` the only
    autolog-only one)."""
    section = README.read_text().split("## Options and docs", 1)[1].split("\n* ", 1)[0]
    assert "autolog only" in section, "README's option list does not say which options are autolog only"
    both, autolog_only = (re.findall(r"`([a-z][a-z0-9_]*)`", part) for part in section.split("autolog only", 1))
    callback_names = {f.name for f in dataclasses.fields(Options)}
    autolog_names = {f.name for f in dataclasses.fields(AutologOptions)} - callback_names
    assert len(both) == len(set(both)) and len(autolog_only) == len(set(autolog_only)), (both, autolog_only)
    assert (set(both), set(autolog_only)) == (callback_names, autolog_names)


def _said(text: str) -> str:
    return " ".join(text.split())  # a phrase may wrap at any space


def test_the_timings_and_limits_the_docs_give_are_the_codes_constants():
    """Each number the docs give of the sender, the memory journal, the request limits, the batch collectives, the
    divergence check, the system metrics and the history elastic keeps for a replay is the constant the code uses, in
    the phrase that says what it is (reliability.md said 5 s before the server counts as down while ``UNANSWERED_S``
    was 6)."""
    import inspect

    from hvd_mlflow.delivery import limits, sender
    from hvd_mlflow.delivery.journal import MEMORY_MAX_POINTS
    from hvd_mlflow.every_rank import divergence, elastic, system_metrics
    from hvd_mlflow.every_rank.batch_steps import STEPS_PER_BATCH_COLLECTIVE

    backoff = sender.Backoff()
    probe = inspect.signature(sender.Sender).parameters["max_backoff"].default
    words = {2: "two", 3: "three", 4: "four", 5: "five"}
    root = REFERENCE.parents[1]
    expected = {
        "docs/reliability.md": [
            f"the sender sends at most every {sender.MIN_SEND_INTERVAL_S:g} s",
            f"backs off {backoff.first:g}, {2 * backoff.first:g}, {4 * backoff.first:g} ... {backoff.maximum:g} s",
            f"| {words[sender.OPEN_AFTER_FAILURES]} failures in a row |",
            f"the server probed every {probe:g} s at most",
            f"a call has waited {sender.UNANSWERED_S:g} s and {sender.SILENT_FACTOR:g} times the slowest answer it had",
            f"went silent) it waits {sender.DOWN_GRACE_S:g} s more at most",
            f"within `flush_timeout` ({Options.flush_timeout:g} s) in total",
            f"at most {MEMORY_MAX_POINTS:,} unsent values",
            f"(<= {limits.MLFLOW.metrics_per_request} metrics, <= {limits.MLFLOW.params_tags_per_request} "
            f"params+tags, <= {limits.MLFLOW.values_per_key_per_request} values per key)",
        ],
        "docs/reference.md": [
            f"({sender.DOWN_GRACE_S:g} s once the server is known not to answer)",
            f"or {sender.START_AFTER_S:g} s into a longer one",
            f"| `run_wait` | `HVD_MLFLOW_RUN_WAIT` | `{Options.run_wait:g}` |",
            f"| `flush_timeout` | `HVD_MLFLOW_FLUSH_TIMEOUT` | `{Options.flush_timeout:g}` |",
        ],
        "README.md": [f"and {sender.DOWN_GRACE_S:g} s once the server is known not to answer"],
        "docs/training-dynamics.md": [
            f"one collective per about {STEPS_PER_BATCH_COLLECTIVE} optimizer steps (every "
            f"`ceil({STEPS_PER_BATCH_COLLECTIVE} / N)` logged batches)",
            f"When the relative spread passes {divergence.TOLERANCE:.0e}, every rank warns once".replace("e-0", "e-"),
            f"every {system_metrics.INTERVAL_S:g} s in a thread",
            f"(the last {elastic.HISTORY_EPOCHS:,} epochs and {elastic.HISTORY_BATCHES:,} batches)",
        ],
    }
    missing = [
        f"{page}: {phrase}"
        for page, phrases in expected.items()
        for phrase in phrases
        if _said(phrase) not in _said((root / page).read_text())
    ]
    assert missing == []


def test_the_docs_of_options_mismatch_error_name_everything_the_ranks_compare():
    """What ``OptionsMismatchError`` compares is what :func:`hvd_mlflow.every_rank.fit_plan.collective_shape` gives
    (the options of ``Options.collective()`` and ``steps_per_execution``): reference.md's entry and reliability.md's
    paragraph name each of them (they named 3 of the 6)."""
    from types import SimpleNamespace

    from hvd_mlflow.every_rank.fit_plan import collective_shape

    compared = [name for name, _ in collective_shape(Options(), SimpleNamespace(steps_per_execution=1))]
    assert "steps_per_execution" in compared and "reduction" in compared
    root = REFERENCE.parents[1]
    entry = REFERENCE.read_text().split("* `hvd_mlflow.OptionsMismatchError`", 1)[1].split("\n* ", 1)[0]
    paragraph = (root / "docs" / "reliability.md").read_text().split("## Every rank calls the same collectives")[1]
    paragraph = paragraph.split("OptionsMismatchError", 1)[0]
    for page, text in (("reference.md", entry), ("reliability.md", paragraph)):
        assert [name for name in compared if f"`{name}`" not in text] == [], page
