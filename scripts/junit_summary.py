"""The end of scripts/test.sh: passed / failed / skipped per Keras mode, from pytest's JUnit reports."""

from __future__ import annotations

import pathlib
import sys
import xml.etree.ElementTree as ET


def main(folder: str) -> None:
    passed = failed = skipped = 0
    for report in sorted(pathlib.Path(folder).glob("*.xml")):
        for suite in ET.parse(report).getroot().iter("testsuite"):
            total, bad = int(suite.get("tests")), int(suite.get("failures")) + int(suite.get("errors"))
            skip = int(suite.get("skipped"))
            print(f"  {report.stem}: {total - bad - skip} passed, {bad} failed, {skip} skipped")
            passed, failed, skipped = passed + total - bad - skip, failed + bad, skipped + skip
    print(f"total: {passed} passed, {failed} failed, {skipped} skipped")


if __name__ == "__main__":
    main(sys.argv[1])
