"""The package's wings keep one direction (README "Layout"): read from every module's imports, lazy ones included.

The rule: ``common/`` imports no wing; ``every_rank/`` (Keras hooks on every rank, what decides collectives) and
``delivery/`` (everything that talks to MLflow) import only ``common/``, and never each other; ``rank_zero/``
imports ``every_rank/``, ``delivery/`` and ``common/``; ``tools/`` (the command line) any wing. Every wing may
import the top's leaves (``config``, ``errors``, ``_log``, ``_version``); none imports the public face
(``autologging``, ``callback``, the package's ``__init__``), and no wing imports ``tools/``.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import hvd_mlflow

WINGS = ("common", "every_rank", "delivery", "rank_zero", "tools")
MAY_IMPORT = {
    "common": {"common"},
    "every_rank": {"common", "every_rank"},
    "delivery": {"common", "delivery"},
    "rank_zero": {"common", "every_rank", "delivery", "rank_zero"},
    "tools": set(WINGS),
}
TOP_LEAVES = {"config", "errors", "_log", "_version"}


def imported_modules(path: Path, package: list[str]) -> list[tuple[int, str]]:
    """Every hvd_mlflow module ``path`` imports (absolute dotted names), with the line, at any depth of the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "hvd_mlflow"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
            elif node.module and node.module.split(".")[0] == "hvd_mlflow":
                base = []
            else:
                continue
            module = [*base, *(node.module.split(".") if node.module else [])]
            if node.module is None:  # from . import a, b: the modules a and b
                found += [(node.lineno, ".".join([*module, a.name])) for a in node.names]
            else:
                found.append((node.lineno, ".".join(module)))
    return found


def violations(root: Path) -> list[str]:
    """Each import of the package under ``root`` that breaks the rule, as ``file:line -> module``."""
    out = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).parts
        if len(relative) == 1:  # the top: the face and its leaves may import anything
            continue
        wing = relative[0]
        package = [root.name, *relative[:-1]]
        for line, module in imported_modules(path, package):
            parts = module.split(".")
            target = parts[1] if len(parts) > 1 else "__init__"
            if target in TOP_LEAVES:
                continue
            if target not in MAY_IMPORT.get(wing, set()):
                out.append(f"{path.relative_to(root.parent)}:{line} -> {module}")
    return out


def test_every_import_between_wings_keeps_the_direction():
    root = Path(hvd_mlflow.__file__).parent
    assert sorted(p.name for p in root.iterdir() if p.is_dir() and (p / "__init__.py").exists()) == sorted(WINGS)
    assert violations(root) == []


def test_the_check_sees_a_wrong_way_import_even_inside_a_function(tmp_path):
    """The checker itself: a delivery module importing every_rank lazily, and a wing importing the face, are caught."""
    root = tmp_path / "hvd_mlflow"
    for wing in WINGS:
        (root / wing).mkdir(parents=True)
        (root / wing / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "delivery" / "sender.py").write_text(
        "from . import journal\nfrom ..common import redact\n\n"
        "def f():\n    from ..every_rank.aggregate import Reducer\n"
    )
    (root / "every_rank" / "fit_plan.py").write_text("from .. import config\nfrom ..callback import X\n")
    (root / "common" / "compat.py").write_text("import hvd_mlflow.tools.cli\n")
    assert violations(root) == [
        "hvd_mlflow/common/compat.py:1 -> hvd_mlflow.tools.cli",
        "hvd_mlflow/delivery/sender.py:5 -> hvd_mlflow.every_rank.aggregate",
        "hvd_mlflow/every_rank/fit_plan.py:2 -> hvd_mlflow.callback",
    ]


def test_every_wing_says_what_may_run_there():
    for wing in WINGS:
        doc = importlib.import_module(f"hvd_mlflow.{wing}").__doc__ or ""
        assert len(doc.split()) > 30, wing


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("hvd_mlflow", "autolog"),
        ("hvd_mlflow", "HorovodMlflowCallback"),
        ("hvd_mlflow.autologging", "autolog"),
        ("hvd_mlflow.callback", "HorovodMlflowCallback"),
    ],
)
def test_the_public_import_paths_keep_working(module, name):
    assert callable(getattr(importlib.import_module(module), name))
