"""``retrograde.schedules`` is pure Python: importing and using it never imports JAX.

The check runs in a fresh interpreter with an import hook that makes ``import jax`` (and
``jaxlib``) fail, so that it stays meaningful whatever ``retrograde/__init__.py`` imports lazily.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

FORBIDDEN = ("jax", "jaxlib", "equinox", "diffrax")

SCRIPT = textwrap.dedent(
    """
    import importlib.abc, sys

    FORBIDDEN = {forbidden!r}

    class Forbid(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in FORBIDDEN:
                raise ImportError(f"retrograde.schedules imported {{name}}")
            return None

    sys.meta_path.insert(0, Forbid())

    import importlib, pkgutil
    import retrograde.schedules as S
    for info in pkgutil.iter_modules(S.__path__):
        importlib.import_module("retrograde.schedules." + info.name)
    for name in dir(S):
        getattr(S, name)

    # Use it, too: nothing may be imported late.
    assert S.simulate(S.Revolve(5), 100).plain == 316
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in FORBIDDEN)
    assert not leaked, leaked
    print("OK")
    """
).format(forbidden=FORBIDDEN)


def test_schedules_do_not_import_jax():
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "OK"


def test_schedule_sources_do_not_mention_jax_imports():
    # A static check too, so a lazily imported jax inside a function is also caught.
    import pathlib
    import re

    import retrograde.schedules as S

    root = pathlib.Path(S.__file__).parent
    pattern = re.compile(r"^\s*(import|from)\s+(jax|jaxlib|equinox|diffrax)\b", re.MULTILINE)
    offenders = [p.name for p in root.glob("*.py") if pattern.search(p.read_text())]
    assert not offenders, offenders
