"""Each layer knows only the ones below it (docs/architecture.md): ``schedules/`` no JAX;
``_store/`` (the snapshot stores both drivers use) neither JAX nor a driver; ``loops/`` and
``host/`` nothing of each other nor of the adapters on top (``diffrax/``); and no module imports
another's private names.

Checked twice: at run time, each layer imported alone in a fresh interpreter, and statically over
every import statement in ``src/`` (a lazy import inside a function included).
"""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "retrograde"

ADAPTERS = ("retrograde.diffrax", "retrograde.pyadjoint", "diffrax", "equinox")
JAX = ("jax", "jaxlib")

#: layer -> modules (and their submodules) it must not import, directly or not.
FORBIDDEN = {
    "retrograde.schedules": (
        *JAX,
        "retrograde.loops",
        "retrograde.host",
        "retrograde._store",
        *ADAPTERS,
    ),
    "retrograde._store": (*JAX, "retrograde.loops", "retrograde.host", *ADAPTERS),
    "retrograde.loops": ("retrograde.host", *ADAPTERS),
    "retrograde.host": ("retrograde.loops", *ADAPTERS),
    "retrograde.planner": (*JAX, "retrograde.loops", "retrograde.host", *ADAPTERS),
}

#: Private names imported across modules: none.
KNOWN_PRIVATE: set = set()


def _hits(modules, forbidden):
    return sorted(m for m in modules if any(m == f or m.startswith(f + ".") for f in forbidden))


@pytest.mark.parametrize("layer", list(FORBIDDEN))
def test_importing_a_layer_imports_nothing_above_or_beside_it(layer):
    script = textwrap.dedent(f"""
        import sys
        import {layer}
        print("\\n".join(sorted(sys.modules)))
        """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert _hits(out.stdout.split(), FORBIDDEN[layer]) == []


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path):
    """``(imported module, [names])`` for every import statement of a source file, relative
    imports made absolute."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            yield target, [alias.name for alias in node.names]


def _is_module(dotted: str) -> bool:
    path = SRC.parent / dotted.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _sources():
    return sorted(SRC.rglob("*.py"))


def test_no_import_statement_crosses_the_layers():
    bad = []
    for path in _sources():
        module = _module_name(path)
        rules = [
            f for layer, f in FORBIDDEN.items() if module == layer or module.startswith(layer + ".")
        ]
        for target, names in _imports(path):
            # "from . import x" imports the submodule x: check it as a module too
            targets = [target] + [f"{target}.{n}" for n in names]
            for forbidden in rules:
                bad += [(module, t) for t in _hits(targets, forbidden)]
    assert bad == []


def test_no_private_name_is_imported_across_modules():
    """``from .mod import _name`` (and ``mod._name`` of an imported module) only within a module;
    a helper two modules share gets a public name. Private modules (``from . import _machine``)
    are fine: their public names are the package's internal interface."""
    found = set()
    for path in _sources():
        module = _module_name(path)
        tree = ast.parse(path.read_text())
        aliases = {}
        for target, names in _imports(path):
            if not target.startswith("retrograde"):
                continue
            for name in names:
                if (
                    name.startswith("_")
                    and not name.startswith("__")
                    and not _is_module(f"{target}.{name}")
                ):
                    found.add((module, target, name))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                for alias in node.names:
                    aliases[alias.asname or alias.name] = alias.name
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                owner = aliases[node.value.id]
                target = module.rpartition(".")[0] + "." + owner
                if _is_module(target):
                    found.add((module, target, node.attr))
    assert found - KNOWN_PRIVATE == set()


def test_jax_internals_live_in_one_module():
    """Every ``jax._src`` import is in ``retrograde/_jax_private.py`` (issue #32): the surface
    an upgrade of JAX has to check."""
    users = sorted(
        str(p.relative_to(SRC))
        for p in SRC.rglob("*.py")
        if "jax._src" in p.read_text(encoding="utf-8")
    )
    assert users == ["_jax_private.py"]
