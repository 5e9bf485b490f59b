"""Run JAX's and diffrax's own test suites with retrograde substituted, and judge the result.

    python compat/run.py --jax-src ~/src/jax --diffrax-src ~/src/diffrax

(``make compat JAX_SRC=... DIFFRAX_SRC=...``.) ``--jax-src`` is a checkout of
https://github.com/jax-ml/jax at the tag of the installed jax (``jax-v0.10.2``): its
``tests/lax_control_flow_test.py`` runs once per substitution of ``jax.lax.scan``,
``jax.lax.fori_loop`` or ``jax.lax.while_loop`` by retrograde's loop and per schedule (see
``MATRIX``; under a loop's first schedule the whole file runs, under the others only the tests
that called the loop). ``--diffrax-src`` is a checkout of https://github.com/patrick-kidger/diffrax
at the installed version's tag (``v0.7.2``): each file of its ``test/`` runs with
``retrograde.diffrax.CheckpointAdjoint()`` as ``diffeqsolve``'s default adjoint. Each suite runs
with its own pytest configuration (jax: warnings are errors; diffrax: jaxtyping's runtime type
checking of diffrax, x64, strict dtype promotion, rank promotion raising). Nothing of either
project is copied into retrograde; the substitution is the pytest plugin ``retrograde_compat``
next to this script. Needs the ``compat`` extra (``pip install -e '.[compat]'``).

A test that crashes the pytest process (a signal, say) is recorded as failed with the exit
status, and its file is resumed after it in a new process, within the same time limit.

Every failure must be listed, with the reason it is out of scope, in ``docs/drop-in.md`` (the
table between the ``exceptions`` markers). The report lists per run the tests passed, failed,
skipped and how many called the substitute, then every failure: listed ones with their reason,
unlisted ones with their error. Exit status 1 if a failure is not listed (or a run crashed),
else 0; listed tests that passed are reported as stale entries.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
EXCEPTIONS = ROOT / "docs" / "drop-in.md"
JAX_TEST = "tests/lax_control_flow_test.py"

# The schedules each substituted loop accepts: scan and fori_loop take offline schedules,
# while_loop (whose step count is unknown) only Online.
MATRIX = {
    "scan": ("default", "revolve2", "storeall", "recomputeall"),
    "fori_loop": ("default", "revolve2", "storeall", "recomputeall"),
    "while_loop": ("default", "online2"),
}


@dataclass
class Run:
    """One pytest run (a process, and one more after each crash): a suite, what it
    substitutes, under which schedule, on which files."""

    suite: str
    substitute: str
    schedule: str
    src: Path
    files: list[str]
    only: Path | None = None  # run only the node ids listed in this file
    records: list[dict] = field(default_factory=list)
    returncode: int = 0
    seconds: float = 0.0
    tail: str = ""

    @property
    def name(self) -> str:
        if self.suite == "diffrax":
            return "diffrax"
        return f"jax/{self.substitute}/{self.schedule}"


def parse_exceptions(path: Path = EXCEPTIONS) -> list[tuple[str, str, str]]:
    """``(run, test, reason)`` rows of the exceptions table in ``docs/drop-in.md``; ``run`` and
    ``test`` may contain ``*`` (any characters)."""
    text = path.read_text()
    m = re.search(r"<!-- exceptions:start -->(.*?)<!-- exceptions:end -->", text, re.S)
    if m is None:
        raise SystemExit(f"{path}: no <!-- exceptions:start --> ... end --> table.")
    rows = []
    for line in m.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not line.strip().startswith("|") or set(cells[0]) <= set("-: "):
            continue
        if cells[0] == "run":
            continue
        run, test, reason = (c.strip("`") if i < 2 else c for i, c in enumerate(cells))
        rows.append((run, test, reason))
    return rows


def _glob(pattern: str) -> re.Pattern:
    return re.compile(".*".join(re.escape(p) for p in pattern.split("*")) + r"\Z")


def listed_reason(rows, run: str, nodeid: str) -> str | None:
    for run_pat, test_pat, reason in rows:
        if _glob(run_pat).match(run) and _glob(test_pat).match(nodeid):
            return reason
    return None


def plan(args) -> list[Run]:
    runs = []
    if args.jax_src:
        src = Path(args.jax_src).resolve()
        if not (src / JAX_TEST).is_file():
            raise SystemExit(f"--jax-src {src}: no {JAX_TEST} (a checkout of jax-ml/jax?).")
        for sub, schedules in MATRIX.items():
            if args.substitute and sub not in args.substitute:
                continue
            for sched in schedules:
                if args.schedule and sched not in args.schedule:
                    continue
                runs.append(Run("jax", sub, sched, src, [JAX_TEST]))
    if args.diffrax_src and (not args.substitute or "diffrax" in args.substitute):
        src = Path(args.diffrax_src).resolve()
        tests = sorted(p.name for p in (src / "test").glob("test_*.py"))
        if not tests:
            raise SystemExit(f"--diffrax-src {src}: no test/test_*.py (a checkout of diffrax?).")
        if args.files:
            tests = [t for t in tests if any(f in t for f in args.files)]
        # One process per file, as diffrax's own `python -m test` does.
        runs += [Run("diffrax", "diffrax", "default", src, [f"test/{t}"]) for t in tests]
    return runs


def crashed_in(records: list[dict]) -> str | None:
    """The test a crashed process was running: the last one started (``None`` if none was)."""
    starts = [rec["nodeid"] for rec in records if rec["when"] == "start"]
    return starts[-1] if starts else None


def execute(run: Run, args, workdir: Path) -> None:
    report = workdir / f"{run.name.replace('/', '_')}_{Path(run.files[0]).stem}.json"
    skip = report.with_suffix(".skip")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
    )
    cmd = [
        sys.executable,
        "-P",
        "-m",
        "pytest",
        *run.files,
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "retrograde_compat",
        f"--retrograde-substitute={run.substitute}",
        f"--retrograde-schedule={run.schedule}",
        f"--retrograde-report={report}",
        *([f"--retrograde-only={run.only}"] if run.only else []),
        *args.pytest_args,
    ]
    start = time.monotonic()
    crashes = []
    while True:
        left = args.timeout - (time.monotonic() - start)
        try:
            proc = subprocess.run(
                cmd + ([f"--retrograde-skip={skip}"] if crashes else []),
                cwd=run.src,
                env=env,
                capture_output=True,
                text=True,
                timeout=max(left, 1),
            )
            run.returncode, out = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as e:
            run.returncode = -1
            out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            out += f"\n(timed out after {args.timeout} s)"
        records = (
            [json.loads(line) for line in report.read_text().splitlines() if line]
            if report.exists()
            else []
        )
        # pytest's exit status: 0 all passed, 1 some failed, 5 nothing selected.
        culprit = crashed_in(records) if run.returncode not in (-1, 0, 1, 5) else None
        if culprit is None or culprit in crashes:
            break
        crashes.append(culprit)
        with report.open("a") as f:
            f.write(
                json.dumps(
                    {
                        "nodeid": culprit,
                        "when": "call",
                        "outcome": "failed",
                        "exercised": 0,
                        "message": f"the pytest process crashed "
                        f"(exit status {run.returncode}) in this test; the file "
                        f"was resumed after it",
                    }
                )
                + "\n"
            )
        skip.write_text("\n".join(sorted({rec["nodeid"] for rec in records} | {culprit})))
    run.seconds = time.monotonic() - start
    run.tail = "\n".join(out.strip().splitlines()[-15:])
    run.records = records


def summarise(runs: list[Run], rows, out=sys.stdout) -> bool:
    """Print the report; True if every failure is listed and every run finished."""
    ok = True
    used = set()
    by_name: dict[str, list[Run]] = {}
    for r in runs:
        by_name.setdefault(r.name, []).append(r)
    print("\n== Summary (passed / failed / skipped; tests that called the substitute)", file=out)
    failures = []
    for name, group in by_name.items():
        recs = [rec for r in group for rec in r.records]
        calls = [rec for rec in recs if rec["when"] == "call"]
        passed = sum(rec["outcome"] == "passed" for rec in calls)
        failed = [rec for rec in recs if rec["outcome"] == "failed"]
        skipped = sum(rec["outcome"] == "skipped" for rec in recs)
        exercised = sum(rec["exercised"] > 0 for rec in calls)
        seconds = sum(r.seconds for r in group)
        print(
            f"{name:28s} {passed:5d} / {len(failed):4d} / {skipped:4d}; {exercised:5d} "
            f"called it ({seconds:.0f} s)",
            file=out,
        )
        for r in group:
            # pytest's exit status: 0 all passed, 1 some failed, 5 nothing selected.
            crashed = r.returncode not in (0, 1, 5) or (not r.records and r.returncode == 1)
            if crashed:
                ok = False
                print(
                    f"  {' '.join(r.files)}: pytest exited with {r.returncode}:\n"
                    + "\n".join("    " + line for line in r.tail.splitlines()),
                    file=out,
                )
        failures += [(name, rec) for rec in failed]
    unlisted = []
    print("\n== Failures listed in docs/drop-in.md", file=out)
    for name, rec in failures:
        reason = listed_reason(rows, name, rec["nodeid"])
        if reason is None:
            unlisted.append((name, rec))
            continue
        used.add(reason)
        print(f"{name}  {rec['nodeid']}\n    out of scope: {reason}", file=out)
    if unlisted:
        ok = False
        print("\n== Failures NOT listed (bugs to fix, or entries to add with a reason)", file=out)
        for name, rec in unlisted:
            print(f"{name}  {rec['nodeid']}\n    {rec['message']}", file=out)
    failed_ids = {(name, rec["nodeid"]) for name, rec in failures}
    stale = []
    for name, group in by_name.items():
        for rec in (rec for r in group for rec in r.records):
            if (
                rec["when"] == "call"
                and rec["outcome"] == "passed"
                and (name, rec["nodeid"]) not in failed_ids
                and listed_reason(rows, name, rec["nodeid"]) is not None
            ):
                stale.append((name, rec["nodeid"]))
    if stale:
        print(f"\n== {len(stale)} listed tests passed (stale entries?)", file=out)
        for name, nodeid in stale[:50]:
            print(f"{name}  {nodeid}", file=out)
    print(
        f"\n{'OK' if ok else 'FAILED'}: {len(failures)} failures, {len(unlisted)} not listed.",
        file=out,
    )
    return ok


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jax-src", help="a checkout of jax-ml/jax at the installed jax's tag")
    p.add_argument(
        "--diffrax-src", help="a checkout of patrick-kidger/diffrax at the installed diffrax's tag"
    )
    p.add_argument(
        "--substitute",
        nargs="*",
        choices=[*MATRIX, "diffrax"],
        help="only these substitutions (default: all)",
    )
    p.add_argument("--schedule", nargs="*", help="only these schedules (jax suite)")
    p.add_argument("--files", nargs="*", help="only diffrax test files containing these names")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per pytest process")
    p.add_argument(
        "--all-tests",
        action="store_true",
        help="jax suite: run every test under every schedule (default: the whole "
        "file under a loop's first schedule, then only the tests that called it)",
    )
    p.add_argument("--json", help="also write every test record to this file")
    p.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    args = p.parse_args(argv)
    if not args.jax_src and not args.diffrax_src:
        p.error("give --jax-src, --diffrax-src or both.")
    rows = parse_exceptions()
    runs = plan(args)
    with tempfile.TemporaryDirectory(prefix="retrograde-compat-") as tmp:
        called: dict[str, Path] = {}  # per substituted loop: the tests that call it
        for run in runs:
            if run.suite == "jax" and run.substitute in called and not args.all_tests:
                run.only = called[run.substitute]
            print(
                f"-- {run.name}: {' '.join(run.files)}"
                + (" (the tests that call it)" if run.only else ""),
                flush=True,
            )
            execute(run, args, Path(tmp))
            if run.suite == "jax" and run.substitute not in called:
                path = Path(tmp) / f"{run.substitute}.calls"
                path.write_text(
                    "\n".join(
                        rec["nodeid"]
                        for rec in run.records
                        if rec["when"] == "call" and rec["exercised"]
                    )
                )
                called[run.substitute] = path
    if args.json:
        Path(args.json).write_text(
            json.dumps([{"run": r.name, **rec} for r in runs for rec in r.records], indent=1)
        )
    return 0 if summarise(runs, rows) else 1


if __name__ == "__main__":
    sys.exit(main())
