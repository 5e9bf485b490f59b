"""Every ``>>>`` example in ``src/`` runs in the default ``pytest`` (issue #32): each file that
has one lies under a ``testpaths`` entry, is not a file the doctest collection passes over
(``__main__.py``, ``setup.py``) nor an ``--ignore``d one, and no example is skipped."""

from __future__ import annotations

import pathlib
import shlex
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _examples():
    """The files in ``src/`` with a ``>>>`` line, and their text."""
    out = {}
    for path in sorted((ROOT / "src").rglob("*.py")):
        text = path.read_text()
        if any(line.lstrip().startswith(">>>") for line in text.splitlines()):
            out[path] = text
    return out


def test_every_example_is_collected():
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    options = options["ini_options"]
    addopts = shlex.split(options["addopts"])
    assert "--doctest-modules" in addopts
    ignored = [ROOT / a.split("=", 1)[1] for a in addopts if a.startswith("--ignore=")]
    testpaths = [ROOT / p for p in options["testpaths"]]
    files = _examples()
    assert len(files) > 20
    missed = [
        str(f.relative_to(ROOT))
        for f in files
        if not any(f.is_relative_to(p) for p in testpaths)
        or any(f.is_relative_to(p) for p in ignored)
        or f.name in ("__main__.py", "setup.py")
    ]
    assert not missed, f"examples no default run collects: {missed}"


def test_no_example_is_skipped():
    skipped = [str(f.relative_to(ROOT)) for f, text in _examples().items() if "+SKIP" in text]
    assert not skipped, f"skipped examples: {skipped}"
