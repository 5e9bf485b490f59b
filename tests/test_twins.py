"""The twins listed in docs/architecture.md ("Twins", issue #32): every row names a reference,
a twin and at least one test; each named module defines the names the row gives it, and each
named test exists."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "retrograde"


def _rows():
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("\n## Twins\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| idea | reference | twin |")
    return [[cell.strip() for cell in row.strip("|").split(" | ")] for row in rows[1:]]


def test_every_twin_has_a_test_that_exists():
    rows = _rows()
    assert len(rows) >= 8
    for idea, _reference, _twin, _why, tests in rows:
        named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", tests)
        assert named, idea
        for path, name in named:
            source = (ROOT / path).read_text()
            assert re.search(rf"^def {name}\(", source, re.M), f"{path}::{name} ({idea})"


def test_every_named_module_defines_its_names():
    for idea, reference, twin, *_ in _rows():
        for cell in (reference, twin):
            modules = re.findall(r"`((?:schedules|loops)/\w+\.py)`(?:: ((?:`\w+`(?:, )?)+))?", cell)
            assert modules, (idea, cell)
            for module, names in modules:
                source = (SRC / module).read_text()
                for name in re.findall(r"`(\w+)`", names):
                    assert re.search(rf"^(?:def|class) {name}\b|^{name} = ", source, re.M), (
                        f"{module} does not define {name} ({idea})"
                    )
