"""docs/overhead.png is drawn from the results bench/README.md shows, not from an older run.

The rule: bench/README.md's results section (between ``<!-- results -->`` and ``<!-- /results -->``) names its
results files by its ``### NAME:`` headings, one per bench/results/NAME.json. The picture's sidecar,
docs/overhead.png.sources.json (written with it by ``python -m bench.figures``), must list exactly those of them
that hold a paired section (``realistic`` or ``small``), each with the SHA-256 of that file as committed now and a
commit date no older than the file's last commit (when git is there to ask), and the SHA-256 of docs/overhead.png
itself. A results file rerun, added or dropped without the picture redrawn fails here, and so does a sidecar that
points at an older file or a picture changed without its sidecar.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from bench import figures

pytestmark = pytest.mark.docs


def problems(sidecar: dict, readme: Path, results: Path, root: Path) -> list[str]:
    """What makes the picture stale against ``readme``'s results section (empty: it is current)."""
    found = []
    picture = root / sidecar["picture"]
    if figures.sha256(picture) != sidecar["picture_sha256"]:
        found.append(f"{sidecar['picture']} is not the picture its sidecar describes: redraw it")
    expected = [f"bench/results/{n}.json" for n in figures.source_names(readme, results)]
    listed = [s["path"] for s in sidecar["sources"]]
    if listed != expected:
        found.append(f"the picture was drawn from {listed}, the results section shows {expected}")
    git = shutil.which("git") and (root / ".git").exists()
    for source in sidecar["sources"]:
        path = root / source["path"]
        if not path.exists() or figures.sha256(path) != source["sha256"]:
            found.append(f"{source['path']} is not the file the picture was drawn from")
            continue
        if git:
            date = subprocess.run(["git", "log", "-1", "--format=%cs", "--", source["path"]], cwd=root,
                                  capture_output=True, text=True, check=False).stdout.strip()  # fmt: skip
            if date and source["committed"] < date:
                found.append(f"{source['path']}: drawn from its commit of {source['committed']}, last commit {date}")
    return found


def sidecar() -> dict:
    return json.loads(figures.SIDECAR.read_text())


def test_the_picture_is_drawn_from_the_results_the_readme_shows():
    found = problems(sidecar(), figures.README, figures.RESULTS, figures.ROOT)
    assert not found, "; ".join(found) + f" (redraw: commit bench/results/, then {figures.COMMAND})"


def test_a_picture_drawn_from_older_results_is_caught():
    """The rule bites: an older version of a source, a source missing and a redrawn picture each fail."""
    good = sidecar()
    older = json.loads(json.dumps(good))
    older["sources"][0]["sha256"] = "0" * 64  # another (older) version of the file
    assert any("is not the file" in p for p in problems(older, figures.README, figures.RESULTS, figures.ROOT))
    dropped = {**good, "sources": good["sources"][1:]}
    assert any("drawn from" in p for p in problems(dropped, figures.README, figures.RESULTS, figures.ROOT))
    redrawn = {**good, "picture_sha256": "0" * 64}
    assert any("redraw" in p for p in problems(redrawn, figures.README, figures.RESULTS, figures.ROOT))
    dated = json.loads(json.dumps(good))
    dated["sources"][0]["committed"] = "2000-01-01"
    if shutil.which("git") and (figures.ROOT / ".git").exists():
        assert any("last commit" in p for p in problems(dated, figures.README, figures.RESULTS, figures.ROOT))
