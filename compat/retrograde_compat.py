"""pytest plugin: run another project's test suite with retrograde substituted.

Loaded with ``-p retrograde_compat`` (this folder on ``PYTHONPATH``; ``compat/run.py`` does
this). Options:

- ``--retrograde-substitute=scan|fori_loop|while_loop``: ``jax.lax.<name>`` becomes
  ``retrograde.<name>`` with the schedule ``--retrograde-schedule`` (``revolve2``,
  ``storeall``, ``recomputeall``, ``online2`` or ``default``: none passed). Every other
  argument is passed through unchanged. A ``fori_loop`` with traced bounds runs a while loop,
  which takes only online schedules: under an offline one it gets the default.
- ``--retrograde-substitute=diffrax``: ``diffrax.diffeqsolve`` called without ``adjoint=``, or
  with ``adjoint=diffrax.RecursiveCheckpointAdjoint(checkpoints=k)`` (the default adjoint), gets
  ``retrograde.diffrax.CheckpointAdjoint()`` (``CheckpointAdjoint(Online(k))`` for a given
  ``k``) instead.
- ``--retrograde-only=PATH``: run only the tests whose node ids the file lists (one a line).
- ``--retrograde-skip=PATH``: leave out the tests whose node ids the file lists (``run.py``
  resumes a file after a test that crashed the process this way).
- ``--retrograde-report=PATH``: JSON lines appended: a ``start`` record when a test starts (so
  a test that crashes the process can be named), then its reports (``nodeid``, ``when``,
  ``outcome``, ``exercised``: the number of calls of the substitute the test made (solves given
  ``CheckpointAdjoint``), ``message``: the exception's last line for a failure).

The substitution happens in ``pytest_configure``: after jaxtyping's import hook is installed
(diffrax's suite type-checks diffrax at runtime, so diffrax must be imported after the hook) and
before the test modules are imported (jax's suite stores ``lax.scan`` in module-level tables).
Only what imports ``jax.lax`` after that point sees the substitute: retrograde's own loops (which
run ``lax.while_loop`` and ``lax.fori_loop``) and JAX's internals keep the real ones.
"""

from __future__ import annotations

import functools
import json

import pytest

SUBSTITUTES = ("scan", "fori_loop", "while_loop", "diffrax")
SCHEDULES = ("default", "revolve2", "storeall", "recomputeall", "online2")

_calls = [0]
_report = [None]  # the --retrograde-report path


def pytest_addoption(parser):
    group = parser.getgroup("retrograde")
    group.addoption(
        "--retrograde-substitute",
        choices=SUBSTITUTES,
        default=None,
        help="what to replace by retrograde's version",
    )
    group.addoption(
        "--retrograde-schedule",
        choices=SCHEDULES,
        default="default",
        help="the schedule the substituted jax.lax loop is given",
    )
    group.addoption(
        "--retrograde-report", default=None, help="write one JSON record per test to this path"
    )
    group.addoption(
        "--retrograde-only",
        default=None,
        help="run only the tests whose node ids this file lists, one a line",
    )
    group.addoption(
        "--retrograde-skip",
        default=None,
        help="leave out the tests whose node ids this file lists, one a line",
    )


def make_schedule(name: str):
    """The schedule called ``name`` (one of :data:`SCHEDULES`); None for ``default``."""
    from retrograde.schedules import Online, RecomputeAll, Revolve, StoreAll

    return {
        "default": None,
        "revolve2": Revolve(2),
        "storeall": StoreAll(),
        "recomputeall": RecomputeAll(),
        "online2": Online(2),
    }[name]


def _counted(fun):
    @functools.wraps(fun)
    def wrapper(*args, **kwargs):
        _calls[0] += 1
        return fun(*args, **kwargs)

    return wrapper


def _lax_substitute(name: str, schedule):
    import jax

    import retrograde

    loop = getattr(retrograde, name)
    if schedule is None:
        return loop
    if name == "fori_loop" and not isinstance(schedule, retrograde.schedules.Online):
        # Traced bounds run a while loop, whose step count is unknown: it takes only online
        # schedules (an offline one is refused, naming the fix), so those calls get the default.
        def fori_loop(lower, upper, body_fun, init_val, **kw):
            traced = any(isinstance(b, jax.core.Tracer) for b in (lower, upper))
            return loop(
                lower, upper, body_fun, init_val, **({} if traced else {"schedule": schedule}), **kw
            )

        return fori_loop
    return functools.partial(loop, schedule=schedule)


def _replace_lax(name: str, fun) -> None:
    """Make ``jax.lax`` (the attribute of ``jax`` and ``sys.modules["jax.lax"]``) a copy of the
    module with ``name`` replaced by ``fun``. Modules imported before (retrograde's loops, which
    run ``lax.while_loop`` themselves; JAX, whose internals import ``jax._src``; the libraries
    the suites use, whose own loops are not under test) keep the real module; the test modules,
    imported later, see the copy."""
    import importlib
    import sys
    import types

    import jax

    import retrograde.loops  # noqa: F401  (imported with the real jax.lax)

    for library in ("equinox", "lineax", "optimistix", "diffrax", "optax"):
        try:
            importlib.import_module(library)
        except ImportError:
            pass

    real = jax.lax
    copy = types.ModuleType(real.__name__, real.__doc__)
    copy.__dict__.update(real.__dict__)
    setattr(copy, name, fun)
    jax.lax = copy
    sys.modules["jax.lax"] = copy


def _diffeqsolve_substitute():
    import inspect

    import diffrax

    from retrograde.diffrax import CheckpointAdjoint
    from retrograde.schedules import Online

    solve = diffrax.diffeqsolve
    signature = inspect.signature(solve)

    @functools.wraps(solve)
    def diffeqsolve(*args, **kwargs):
        bound = signature.bind_partial(*args, **kwargs)
        adjoint = bound.arguments.get("adjoint")
        if adjoint is None or type(adjoint) is diffrax.RecursiveCheckpointAdjoint:
            k = None if adjoint is None else adjoint.checkpoints
            bound.arguments["adjoint"] = CheckpointAdjoint(None if k is None else Online(k))
            _calls[0] += 1
        return solve(*bound.args, **bound.kwargs)

    return diffeqsolve


def pytest_configure(config):
    _report[0] = config.getoption("--retrograde-report")
    what = config.getoption("--retrograde-substitute")
    if what is None:
        return
    if what == "diffrax":
        import diffrax

        diffrax.diffeqsolve = _diffeqsolve_substitute()
    else:
        schedule = make_schedule(config.getoption("--retrograde-schedule"))
        _replace_lax(what, _counted(_lax_substitute(what, schedule)))


def pytest_report_header(config):
    what = config.getoption("--retrograde-substitute")
    if what is None:
        return "retrograde: nothing substituted"
    if what == "diffrax":
        return (
            "retrograde: diffrax.diffeqsolve's default adjoint (RecursiveCheckpointAdjoint) is "
            "CheckpointAdjoint()"
        )
    return (
        f"retrograde: jax.lax.{what} is retrograde.{what}, schedule "
        f"{config.getoption('--retrograde-schedule')}"
    )


def _node_ids(path) -> set[str]:
    with open(path) as f:
        return set(f.read().splitlines()) - {""}


def pytest_collection_modifyitems(config, items):
    only, skip = config.getoption("--retrograde-only"), config.getoption("--retrograde-skip")
    keep = _node_ids(only) if only else None
    drop = _node_ids(skip) if skip else set()
    chosen, left_out = [], []
    for item in items:
        wanted = (keep is None or item.nodeid in keep) and item.nodeid not in drop
        (chosen if wanted else left_out).append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = chosen


def _write_record(record):
    with open(_report[0], "a") as f:  # one line per record, written at once: a crash keeps them
        f.write(json.dumps(record) + "\n")


def pytest_runtest_logstart(nodeid, location):
    if _report[0]:
        _write_record(
            {"nodeid": nodeid, "when": "start", "outcome": "started", "exercised": 0, "message": ""}
        )


def pytest_runtest_setup(item):
    _calls[0] = 0


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if _report[0] and (report.when == "call" or report.outcome != "passed"):
        message = ""
        if call.excinfo is not None and report.outcome == "failed":
            message = call.excinfo.exconly().strip().splitlines()[0][:300]
        _write_record(
            {
                "nodeid": report.nodeid,
                "when": report.when,
                "outcome": report.outcome,
                "exercised": _calls[0],
                "message": message,
            }
        )
    return report
