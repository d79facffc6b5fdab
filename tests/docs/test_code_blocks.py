"""Every code block of the README and docs/ runs, in document order, as a reader would run it.

* ```` ```python ```` blocks run in a fresh process each (forked from one that imported TensorFlow and Horovod:
  tests/support/zygote.py), in the page's working directory, after a small
  setup (:data:`SETUP`: Horovod initialised as one process, a compiled ``model``, shards ``x_shard``/``y_shard``,
  ``xv_shard``/``yv_shard``, ``my_callbacks``), with MLflow's default local store. Blocks assert what they
  claim where it can be asserted.
* ```` ```bash ```` blocks run with ``bash -euo pipefail`` in the page's working directory (``cwd=repo``: the
  repository), the test environment's ``bin`` first on ``PATH``.
* ```` ```yaml ```` blocks must parse; ```` ```text ```` blocks are output or diagrams, not code.
* A directive in an HTML comment right above a block changes that: ``<!-- docs-test: file=train.py -->`` writes
  the block to a file of the working directory (a later block runs it); ``<!-- docs-test: skip REASON -->``
  does not run it, and REASON must say why (what cannot run here) and where it is tested instead.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.environment import clean_environment
from tests.support.zygote import Zygote

pytestmark = [pytest.mark.docs, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\S*)\s*$")
DIRECTIVE = re.compile(r"^<!--\s*docs-test:\s*(.*?)\s*-->\s*$")
SETUP = """
import horovod.tensorflow as hvd
import mlflow
import numpy as np
import tensorflow as tf

import hvd_mlflow

keras = tf.keras
hvd.init()
_rng = np.random.default_rng(0)
x_shard = _rng.normal(size=(64, 8)).astype("float32")
y_shard = (x_shard.sum(axis=1) > 0).astype("float32")
xv_shard, yv_shard = x_shard[:16], y_shard[:16]
model = keras.Sequential([keras.Input(shape=(8,)), keras.layers.Dense(4, activation="relu"),
                          keras.layers.Dense(1, activation="sigmoid")])
model.compile(optimizer="sgd", loss="binary_crossentropy", metrics=["accuracy"])
my_callbacks = []
"""
MAX_SKIPPED = 7  # a skipped block is an exception, each with its reason (the 7th: README's JAX engine, two processes)


@dataclass
class Block:
    page: Path
    line: int
    language: str
    code: str
    directive: str

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line} ({self.language})"


def blocks(page: Path) -> list[Block]:
    out, lines, i = [], page.read_text().splitlines(), 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        start, language = i, match[1]
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        above = DIRECTIVE.match(lines[start - 1]) if start else None
        code = "\n".join(lines[start + 1 : end]) + "\n"
        out.append(Block(page, start + 1, language, code, above[1] if above else ""))
        i = end + 1
    return out


def environment() -> dict[str, str]:
    env = clean_environment()
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", HOROVOD_GLOO_TIMEOUT_SECONDS="60")
    return env


@pytest.fixture(scope="module")
def zygote():
    """Python blocks run each in a fresh process forked from one that imported TensorFlow and Horovod once
    (tests/support/zygote.py): a reader's fresh interpreter, without TensorFlow's import per block."""
    with Zygote(environment()) as forked:
        yield forked


def run(block: Block, workdir: Path, zygote: Zygote) -> None:
    if block.language == "python":
        script = workdir / f"block_{block.line}.py"
        script.write_text(SETUP + "\n" + block.code)
        returncode, output = zygote.run(script, cwd=workdir, env=environment(), timeout=900)
    else:
        cwd = ROOT if "cwd=repo" in block.directive else workdir
        command = ["bash", "-euo", "pipefail", "-c", block.code]
        done = subprocess.run(command, cwd=cwd, env=environment(), capture_output=True, text=True, timeout=900)
        returncode, output = done.returncode, done.stdout + done.stderr
    assert returncode == 0, f"{block} failed (exit {returncode}):\n{block.code}\n{output[-5000:]}"


def test_every_block_declares_a_language_and_skips_are_rare():
    found = [b for page in PAGES for b in blocks(page)]
    assert len(found) >= 20
    undeclared = [str(b) for b in found if b.language not in ("python", "bash", "text", "yaml")]
    assert not undeclared, f"declare python, bash, yaml or text: {undeclared}"
    skipped = [b for b in found if b.directive.startswith("skip")]
    assert all(len(b.directive.split(None, 1)[-1]) > 20 for b in skipped), [str(b) for b in skipped]
    assert len(skipped) <= MAX_SKIPPED, [str(b) for b in skipped]
    print(f"{len(found)} blocks; skipped with a reason: " + "; ".join(f"{b}: {b.directive[5:]}" for b in skipped))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_code_blocks_run(page: Path, tmp_path: Path, zygote: Zygote):
    import yaml

    ran = 0
    for block in blocks(page):
        if block.language == "text" or block.directive.startswith("skip"):
            continue
        if block.language == "yaml":
            yaml.safe_load(block.code)
        elif block.directive.startswith("file="):
            (tmp_path / block.directive.removeprefix("file=")).write_text(block.code)
        else:
            run(block, tmp_path, zygote)
        ran += 1
    print(f"{page.name}: {ran} block(s) ran")
