"""Regenerate the comparison table of docs/benchmarks.md from the benchmark scripts.

Runs, each as a subprocess in its quick mode with markdown output (small sizes, a timeout each):

- ``benchmarks/scan.py --quick --markdown``: first-order gradient vs ``jax.lax.scan``, nested
  remat and equinox's checkpointed scan;
- ``benchmarks/higher_order.py --quick --markdown``: HVP, grad of grad, third order vs
  ``jax.lax.scan`` and nested remat;
- ``benchmarks/diffrax_adjoints.py --quick --markdown`` (if present): ``CheckpointAdjoint`` vs
  diffrax's ``DirectAdjoint`` and ``RecursiveCheckpointAdjoint``;
- ``benchmarks/host.py --steps 200 --size 200000``: ``retrograde.host`` vs ``StoreAll`` and
  ``pyrevolve`` (which already prints a markdown table);
- ``benchmarks/overhead.py --quick --markdown``: the per-step overhead targets of issue #18 (its
  tables of ratios go into docs/benchmarks.md only, not into the README's summary);

then writes a combined summary (memory and time of each method against the baseline of its
benchmark) followed by every benchmark's own tables, with the command, date and machine, into
``docs/benchmarks.md`` between ``<!-- table:start -->`` and ``<!-- table:end -->``.

    python benchmarks/readme_table.py                  # ~8-13 minutes on 2 CPU cores
    python benchmarks/readme_table.py --only scan,host # a subset
    python benchmarks/readme_table.py --save-raw DIR   # also keep each script's raw output
    python benchmarks/readme_table.py --load-raw DIR   # rebuild the page without rerunning
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

from _common import write_between_markers

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
README = ROOT / "README.md"
START, END = "<!-- table:start -->", "<!-- table:end -->"

# name -> (script, arguments, timeout in seconds, title)
BENCHMARKS = {
    "scan": (
        "scan.py",
        ["--quick", "--markdown"],
        600,
        "First-order gradient of a long scan (benchmarks/scan.py)",
    ),
    "higher_order": (
        "higher_order.py",
        ["--quick", "--markdown"],
        600,
        "Higher-order derivatives of a long scan (benchmarks/higher_order.py)",
    ),
    "diffrax": (
        "diffrax_adjoints.py",
        [
            "--quick",
            "--markdown",
            "--adjoints",
            "CheckpointAdjoint,RecursiveCheckpoint,DirectAdjoint",
        ],
        900,
        "diffrax adjoints on a neural ODE (benchmarks/diffrax_adjoints.py)",
    ),
    "host": (
        "host.py",
        ["--steps", "200", "--size", "200000"],
        600,
        "Host-driven NumPy loop (benchmarks/host.py)",
    ),
    "overhead": (
        "overhead.py",
        ["--quick", "--markdown"],
        900,
        "Per-step overhead at every size, the targets of issue #18 (benchmarks/overhead.py)",
    ),
}


# ------------------------------------------------------------------------------ running
def run(name: str) -> tuple[str, float, str]:
    """``(stdout, seconds, note)`` of one benchmark script."""
    script, args, timeout, _ = BENCHMARKS[name]
    path = ROOT / "benchmarks" / script
    if not path.is_file():
        return "", 0.0, f"{script} not found"
    cmd = [sys.executable, str(path), *args]
    print(f"== {' '.join(['python', 'benchmarks/' + script, *args])}", flush=True)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return out, time.perf_counter() - t0, f"timed out after {timeout} s"
    seconds = time.perf_counter() - t0
    note = (
        ""
        if proc.returncode == 0
        else (f"failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    )
    print(f"   {seconds:.0f} s{'; ' + note if note else ''}", flush=True)
    return proc.stdout, seconds, note


# ------------------------------------------------------------------------------ parsing
def tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every markdown table in ``text`` as ``(header, rows)``."""
    found, block = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            block.append([c.strip() for c in line.strip().strip("|").split("|")])
            continue
        if len(block) >= 2:
            found.append((block[0], block[2:]))
        block = []
    return found


def markdown_part(text: str) -> str:
    """The report part of a script's output: from its first heading or table on, without the
    progress lines (indented) that some scripts print while they run."""
    lines = text.splitlines()
    first = next((i for i, ln in enumerate(lines) if ln.startswith(("#", "|"))), len(lines))
    keep = [ln for ln in lines[first:] if not ln.startswith("  ")]
    return "\n".join(keep).strip()


def col(header: list[str], *names: str) -> int:
    for name in names:
        if name in header:
            return header.index(name)
    raise KeyError(f"none of {names} in {header}")


def num(cell: str) -> float | None:
    try:
        return float(cell.replace(",", ""))
    except ValueError:
        return None


def ratio(x, ref) -> str:
    if x is None or ref is None or ref == 0:
        return "-"
    r = x / ref
    return f"{r:.2f}" if r >= 0.1 else f"{r:.2g}"


def summary_rows(name: str, text: str) -> list[list[str]]:
    """Summary rows ``[benchmark, derivative, method, memory, memory / baseline, time,
    time / baseline]`` for one benchmark's output."""
    out = []
    for header, rows in tables(text):
        try:
            if name == "scan":
                m, mem, t = col(header, "method"), col(header, "temp MiB"), col(header, "time ms")
                groups = {"first order": rows}
                base_name, mem_unit, t_unit = "lax.scan", "MiB temp", "ms"
                bench = "scan.py (N=1000)"
            elif name == "higher_order":
                d, m = col(header, "derivative"), col(header, "loop")
                mem, t = col(header, "temp MiB"), col(header, "time ms")
                groups = {}
                for r in rows:
                    groups.setdefault(r[d], []).append(r)
                base_name, mem_unit, t_unit = "lax.scan", "MiB temp", "ms"
                bench = "higher_order.py (N=10000)"
            elif name == "diffrax":
                run_c, d, m = col(header, "run"), col(header, "derivative"), col(header, "adjoint")
                mem, t = col(header, "temp MiB"), col(header, "run s")
                groups = {}
                for r in rows:
                    groups.setdefault(f"{r[d]}, {r[run_c]}", []).append(r)
                base_name, mem_unit, t_unit = "DirectAdjoint", "MiB temp", "s"
                bench = "diffrax_adjoints.py"
            elif name == "host":
                m, mem, t = (
                    col(header, "row"),
                    col(header, "peak - baseline (MiB)"),
                    col(header, "time (s)"),
                )
                groups = {"gradient": [r for r in rows if not r[m].startswith("forward")]}
                base_name, mem_unit, t_unit = "StoreAll", "MiB RSS", "s"
                bench = "host.py (N=200)"
            else:
                continue
        except KeyError:
            continue
        for group, grows in groups.items():
            base = next((r for r in grows if r[m].startswith(base_name)), None)
            for r in grows:
                if len(r) <= max(mem, t) or "skipped" in r[1] or r[mem] in ("", "-"):
                    note = r[-1] or next((c for c in r[1:] if c), "")
                    out.append([bench, group, r[m], note, "", "", ""])
                    continue
                bm = num(base[mem]) if base else None
                bt = num(base[t]) if base else None
                out.append(
                    [
                        bench,
                        group,
                        r[m],
                        f"{r[mem]} {mem_unit}",
                        ratio(num(r[mem]), bm),
                        f"{r[t]} {t_unit}",
                        ratio(num(r[t]), bt),
                    ]
                )
    return out


# ------------------------------------------------------------------------------ the page
def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(
                (ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), cpu
            )
    except OSError:
        pass
    try:
        import jax

        jax_note = f"jax {jax.__version__} on {jax.devices()[0].platform}"
    except Exception:  # noqa: BLE001
        jax_note = "jax not importable"
    load = ""
    if hasattr(os, "getloadavg"):
        load = f", load average {os.getloadavg()[0]:.1f} at the end"
    return f"{cpu}, {os.cpu_count()} cores{load}; Python {platform.python_version()}, {jax_note}"


def render(
    outputs: dict[str, tuple[str, float, str]], argv: list[str], when: str, where: str
) -> str:
    lines = [
        "Generated by `python benchmarks/readme_table.py"
        + (" " + " ".join(argv) if argv else "")
        + f"` on {when}.",
        f"Machine: {where}. Timings on a shared, loaded machine are indicative only;",
        "memory figures (XLA's `temp_size_in_bytes` of the compiled derivative, or the peak RSS",
        "above the baseline for the host loop) do not depend on load.",
        "",
        "### Summary: each method against the baseline of its benchmark",
        "",
        "Baseline: `jax.lax.scan` (scan, higher order), `diffrax.DirectAdjoint` (diffrax),"
        " `StoreAll` in RAM (host). Ratios below 1 are better.",
        "",
        "| benchmark | derivative | method | memory | memory / baseline | time | time / baseline |",
        "|:---|:---|:---|---:|---:|---:|---:|",
    ]
    for name, (text, _, _) in outputs.items():
        for r in summary_rows(name, text):
            lines.append("| " + " | ".join(r) + " |")
    for name, (text, seconds, note) in outputs.items():
        script, args, _, title = BENCHMARKS[name]
        lines += [
            "",
            f"### {title}",
            "",
            f"`python benchmarks/{script} {' '.join(args)}`"
            + (f" ({seconds:.0f} s)" if seconds else ""),
        ]
        if note:
            lines += ["", f"_{note}_"]
        body = markdown_part(text)
        if body:
            # demote the scripts' own headings below this page's
            body = re.sub(r"^#{1,3} ", "#### ", body, flags=re.MULTILINE)
            lines += ["", body]
    return "\n".join(lines) + "\n"


def write_doc(block: str) -> None:
    DOC.parent.mkdir(exist_ok=True)
    if not DOC.exists():
        DOC.write_text(
            "# Benchmarks\n\nMemory and time of retrograde against `jax.lax.scan`, nested "
            "remat, equinox's checkpointed scan, diffrax's adjoints and pyrevolve.\n"
        )
    write_between_markers(DOC, START, END, block)
    # The README carries the summary (everything before the per-benchmark sections).
    summary = block.split("\n### ", 2)
    summary = summary[0] + ("\n### " + summary[1] if len(summary) > 1 else "")
    readme = README.read_text()
    if START in readme and END in readme:
        write_between_markers(README, START, END, summary)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--only",
        default=",".join(BENCHMARKS),
        help=f"comma-separated subset of {','.join(BENCHMARKS)}",
    )
    ap.add_argument("--save-raw", metavar="DIR", help="keep each script's stdout in DIR")
    ap.add_argument("--load-raw", metavar="DIR", help="use saved stdout from DIR, run nothing")
    ap.add_argument("--print", action="store_true", help="print the block instead of writing")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        ap.error(f"unknown benchmark(s) {unknown}; choose from {list(BENCHMARKS)}")
    outputs = {}
    meta = {}
    if args.load_raw:
        meta_path = Path(args.load_raw) / "meta.json"
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    for name in names:
        if args.load_raw:
            path = Path(args.load_raw) / f"{name}.md"
            seconds, note = meta.get("runs", {}).get(name, (0.0, ""))
            outputs[name] = (
                (path.read_text(), seconds, note) if path.exists() else ("", 0.0, "no saved output")
            )
        else:
            outputs[name] = run(name)
    when = meta.get("when") or dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    where = meta.get("where") or machine()
    if args.save_raw and not args.load_raw:
        raw = Path(args.save_raw)
        raw.mkdir(parents=True, exist_ok=True)
        for name, (text, _seconds, _note) in outputs.items():
            (raw / f"{name}.md").write_text(text)
        runs = {name: [seconds, note] for name, (_, seconds, note) in outputs.items()}
        (raw / "meta.json").write_text(json.dumps({"when": when, "where": where, "runs": runs}))
    shown = []
    skip = False
    for a in argv:  # the command line to show, without the raw-output options
        if skip:
            skip = False
        elif a in ("--save-raw", "--load-raw"):
            skip = True
        elif not a.startswith(("--save-raw=", "--load-raw=", "--print")):
            shown.append(a)
    block = render(outputs, shown, when, where)
    if args.print:
        print(block)
    else:
        write_doc(block)
        print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
