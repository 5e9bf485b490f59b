"""The planner: budget parsing, the table of schedules, the command line and the picture."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrograde.__main__ import main
from retrograde.planner import (
    Row,
    format_size,
    format_table,
    parse_size,
    periodic_counts,
    plan,
    plot_schedule,
)
from retrograde.schedules import Mixed, Periodic, Revolve, ScheduleError, StoreAll, simulate

# ---------------------------------------------------------------------------------------------
# Sizes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2GiB", 2 * 2**30),
        ("500MB", 500 * 10**6),
        ("10MiB", 10 * 2**20),
        ("1e9", 10**9),
        ("4096", 4096),
        ("1.5 KiB", 1536),
        ("2gib", 2 * 2**30),
        ("3kB", 3000),
        ("7B", 7),
        ("1TiB", 2**40),
        (4096, 4096),
        (1e3, 1000),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "2XB", "-1GiB", "1..2MB", "0", "0.1", "2 G B"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError, match="memory"):
        parse_size(text, "memory")


def test_parse_size_types():
    with pytest.raises(TypeError, match="memory"):
        parse_size(None, "memory")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="memory"):
        parse_size(True, "memory")


def test_format_size():
    assert format_size(1) == "1 B"
    assert format_size(1536) == "1.5 KiB"
    assert format_size(2**31) == "2 GiB"
    assert format_size(204 * 10 * 2**20) == "1.99 GiB"
    assert format_size(999 * 10 * 2**20) == "9.76 GiB"
    assert format_size(2**50 * 3000) == "3000 PiB"


# ---------------------------------------------------------------------------------------------
# plan()
# ---------------------------------------------------------------------------------------------


def test_plan_with_snapshots():
    rows = plan(1000, snapshots=10)
    names = [r.name for r in rows]
    assert names[0] == "Revolve(10)" and names[-1] == "RecomputeAll()"
    best = rows[0]
    assert best.recommended and not any(r.recommended for r in rows[1:])
    assert (best.plain, best.recorded, best.evaluations) == (3636, 1000, 4636)
    assert best.overhead == pytest.approx(4636 / 1999)
    assert best.memory_slots == 10 and best.memory_bytes is None
    assert all(r.name != "StoreAll()" for r in rows)  # 999 slots do not fit
    assert rows == sorted(rows, key=lambda r: r.cost)


def test_plan_design_note_figure():
    rows = plan(1000, snapshots=20)
    assert rows[0].name == "Revolve(20)" and rows[0].plain == 2747


def test_plan_with_memory_budget():
    rows = plan(1000, memory="2GiB", state_size="10MiB")
    by_name = {r.name.split("(")[0]: r for r in rows}
    revolve = by_name["Revolve"]
    assert revolve.name == "Revolve(204)"  # floor(2048 MiB / 10 MiB)
    assert revolve.plain == simulate(Revolve(204), 1000).plain
    assert revolve.memory_bytes == 204 * 10 * 2**20
    assert "Periodic" in by_name
    assert by_name["Periodic"].memory_slots <= 204
    assert by_name["RecomputeAll"].memory_slots == 1
    for row in rows:
        assert row.memory_bytes <= 2 * 2**30


def test_plan_store_all_when_it_fits():
    rows = plan(100, snapshots=150)
    assert rows[0].name == "StoreAll()" and rows[0].recommended
    assert (rows[0].plain, rows[0].memory_slots, rows[0].overhead) == (99, 99, 1.0)
    assert plan(100, snapshots=99)[0].name == "StoreAll()"
    assert all(r.name != "StoreAll()" for r in plan(100, snapshots=98))


def test_plan_rows_agree_with_the_simulator():
    for n, s in [(1, 1), (2, 1), (2, 5), (10, 3), (57, 12), (300, 40), (1000, 70)]:
        for row in plan(n, snapshots=s):
            stats = simulate(row.schedule, n)
            assert (row.plain, row.recorded) == (stats.plain, stats.recorded), row.name
            assert row.memory_slots == stats.peak_slots[0], row.name
            assert row.memory_slots <= s, row.name
            assert row.cost == stats.cost


@pytest.mark.parametrize("disk", ["8MiB", "64MiB", "1GiB"])
def test_plan_disk_rows_fit_and_agree(disk):
    n = 400
    rows = plan(
        n, snapshots=6, state_size="1MiB", disk=disk, disk_write_cost=1.0, disk_read_cost=1.0
    )
    budget = parse_size(disk) // 2**20
    multi = [r for r in rows if r.name.startswith("MultiLevel")]
    assert len(multi) == 1
    row = multi[0]
    stats = simulate(row.schedule, n)
    assert row.disk_slots == sum(stats.peak_slots[1:]) <= budget
    assert row.memory_slots == stats.peak_slots[0] <= 6
    assert row.cost == stats.cost
    assert row.cost <= next(r.cost for r in rows if r.name == "Revolve(6)")


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 400), every=st.integers(1, 60))
def test_periodic_closed_form(n, every):
    stats = simulate(Periodic(every), n)
    assert periodic_counts(n, every) == (stats.plain, stats.peak_slots[0])


def test_plan_huge_n_is_instant():
    rows = plan(10**9, memory="64GiB", state_size="1MiB")
    assert rows[0].name.startswith("Revolve(")
    assert rows[-1].name == "RecomputeAll()"


def test_plan_disk_without_multilevel_or_with_it():
    rows = plan(300, snapshots=10, state_size="1MiB", disk="1GiB")
    assert rows[0].recommended
    for row in rows:
        assert row.disk_bytes == row.disk_slots * 2**20
        assert row.disk_slots <= 1024


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(), "budget"),
        (dict(snapshots=3, memory="1GiB", state_size="1MiB"), "not both"),
        (dict(memory="1GiB"), "state_size"),
        (dict(memory="1MiB", state_size="1GiB"), "holds no state"),
        (dict(snapshots=0), "snapshots"),
        (dict(snapshots=4, disk="1GiB"), "state_size"),
        (dict(snapshots=4, state_size="1GiB", disk="1MiB"), "disk"),
        (dict(snapshots=4, disk_write_cost=-1.0), "disk_write_cost"),
        (dict(snapshots=4, disk_read_cost=float("nan")), "disk_read_cost"),
        (dict(memory="lots", state_size="1MiB"), "memory"),
    ],
)
def test_plan_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        plan(100, **kwargs)


def test_plan_bad_steps():
    with pytest.raises(ValueError, match="n_steps"):
        plan(0, snapshots=3)
    with pytest.raises(TypeError, match="n_steps"):
        plan(10.5, snapshots=3)  # type: ignore[arg-type]


def test_format_table_marks_the_recommendation():
    text = format_table(plan(1000, snapshots=10))
    lines = text.splitlines()
    assert "schedule" in lines[0] and "overhead" in lines[0]
    assert lines[2].startswith("*") and "Revolve(10)" in lines[2] and "3,636" in lines[2]
    assert not lines[3].startswith("*")


def test_plan_with_a_data_size():
    rows = plan(1000, snapshots=20, data_size=1)
    best = rows[0]
    assert best.schedule == Mixed(20, 1) and best.recommended
    assert (best.plain, best.linearized, best.recorded, best.evaluations) == (1823, 924, 76, 2823)
    assert best.cost == 2823 and best.memory_slots == 20
    assert [r.name for r in rows][1] == "Revolve(20)"
    # Data larger than the budget: Mixed is Revolve, and ties go to the listed order.
    mixed = next(r for r in plan(1000, snapshots=10, data_size=11) if r.name.startswith("Mixed"))
    assert (mixed.evaluations, mixed.linearized) == (4636, 0)


def test_plan_with_a_data_size_in_bytes():
    rows = plan(10_000, memory="200MiB", state_size="10MiB", data_size="25MiB")
    mixed = next(r for r in rows if r.name.startswith("Mixed"))
    assert mixed.name == "Mixed(20, data 2.5)"
    assert mixed.schedule == Mixed.from_bytes(200 * 2**20, 10 * 2**20, 25 * 2**20)
    assert mixed.evaluations == mixed.schedule.evaluations(10_000) < 47_976  # Revolve(20)
    assert mixed.memory_bytes is not None and mixed.memory_bytes <= 200 * 2**20
    table = format_table(rows)
    assert "linearized" in table.splitlines()[0]


def test_plan_data_size_errors():
    with pytest.raises(TypeError, match="data_size"):
        plan(100, snapshots=5, data_size="1MiB")
    with pytest.raises(ValueError, match="data_size"):
        plan(100, snapshots=5, state_size="1MiB", data_size="0")


def test_row_is_a_frozen_record():
    row = plan(10, snapshots=3)[0]
    assert isinstance(row, Row)
    with pytest.raises(AttributeError):
        row.plain = 0  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------------


def test_cli_snapshots(capsys):
    assert main(["plan", "--steps", "1000", "--snapshots", "10"]) == 0
    out = capsys.readouterr().out
    assert "N = 1,000" in out
    line = next(ln for ln in out.splitlines() if "Revolve(10)" in ln and ln.startswith("*"))
    assert "3,636" in line and "1,000" in line and "4,636" in line and "2.319" in line
    assert "RecomputeAll()" in out and "499,500" in out
    assert "StoreAll() needs 999 slots" in out
    assert "recommended: Revolve(10)" in out


def test_cli_memory_budget(capsys):
    argv = ["plan", "--steps", "1e3", "--memory", "2GiB", "--state-size", "10MiB"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "204 memory slots of 10 MiB" in out
    assert "Revolve(204)" in out and "1.99 GiB" in out and "peak memory" in out
    assert "Periodic(" in out


def test_cli_store_all_recommended(capsys):
    assert main(["plan", "-n", "50", "-s", "64"]) == 0
    out = capsys.readouterr().out
    star = [ln for ln in out.splitlines() if ln.startswith("*  ")]
    assert len(star) == 1 and "StoreAll()" in star[0] and "1.000" in star[0]


def test_cli_disk(capsys):
    argv = [
        "plan",
        "--steps",
        "500",
        "--memory",
        "100MiB",
        "--state-size",
        "10MiB",
        "--disk",
        "1GiB",
        "--disk-write-cost",
        "0.5",
        "--disk-read-cost",
        "0.5",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "102 disk slots" in out
    assert "Revolve(10)" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("*"))
    assert "MultiLevel(10 mem, 102 disk)" in line  # cheap disk beats recomputation
    assert "peak disk" in out


def test_cli_data_size(tmp_path, capsys):
    path = tmp_path / "mixed.png"
    argv = ["plan", "-n", "60", "-s", "5", "--data-size", "1", "--plot", str(path)]
    assert main([*argv, "--schedule", "mixed"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("*"))
    assert "Mixed(5, data 1)" in line and "178" in line
    assert "linearized" in out and "Drew Mixed(5, data 1)" in out and path.exists()
    argv = ["plan", "-n", "1e3", "--memory", "100MiB", "--state-size", "10MiB"]
    assert main([*argv, "--data-size", "5MiB"]) == 0
    assert "Mixed(10, data 0.5)" in capsys.readouterr().out


def test_cli_plot(tmp_path, capsys):
    path = tmp_path / "schedule.png"
    assert main(["plan", "--steps", "60", "--snapshots", "5", "--plot", str(path)]) == 0
    assert path.exists() and path.stat().st_size > 10_000
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Drew Revolve(5)" in capsys.readouterr().out


def test_cli_plot_chosen_schedule(tmp_path, capsys):
    path = tmp_path / "periodic.svg"
    argv = [
        "plan",
        "--steps",
        "100",
        "--snapshots",
        "30",
        "--plot",
        str(path),
        "--schedule",
        "periodic",
    ]
    assert main(argv) == 0
    assert path.stat().st_size > 1000
    assert "Drew Periodic(" in capsys.readouterr().out


BAD = [
    (["plan", "--snapshots", "3"], "--steps"),
    (["plan", "--steps", "100"], "--snapshots"),
    (["plan", "--steps", "abc", "-s", "3"], "--steps"),
    (["plan", "--steps", "1.5", "-s", "3"], "--steps"),
    (["plan", "--steps", "0", "-s", "3"], "--steps"),
    (["plan", "--steps", "100", "--snapshots", "0"], "--snapshots"),
    (["plan", "--steps", "100", "--snapshots", "x"], "--snapshots"),
    (["plan", "--steps", "100", "--memory", "2GiB"], "--state-size"),
    (["plan", "--steps", "100", "--memory", "2XB", "--state-size", "1MiB"], "--memory"),
    (["plan", "--steps", "100", "--memory", "1MiB", "--state-size", "2MiB"], "--memory"),
    (["plan", "--steps", "100", "-s", "3", "--memory", "1GiB", "--state-size", "1MiB"], "--memory"),
    (["plan", "--steps", "100", "-s", "3", "--disk", "1GiB"], "--disk"),
    (["plan", "--steps", "100", "-s", "3", "--disk-read-cost", "-2"], "--disk-read-cost"),
    (["plan", "--steps", "100", "-s", "3", "--schedule", "revolve"], "--plot"),
    (["plan", "--steps", "100", "-s", "3", "--plot", "x.png", "--schedule", "magic"], "--schedule"),
    (
        ["plan", "--steps", "100", "-s", "3", "--plot", "x.png", "--schedule", "storeall"],
        "--schedule",
    ),
    (["plan", "--steps", "1e8", "-s", "3", "--plot", "x.png"], "--plot"),
    (["plan", "--steps", "100", "-s", "3", "--data-size", "big"], "--data-size"),
    (["plan", "--steps", "100", "-s", "3", "--data-size", "-1"], "--data-size"),
    (
        ["plan", "-n", "100", "--memory", "9MiB", "--state-size", "1MiB", "--data-size", "x"],
        "--data-size",
    ),
    ([], "COMMAND"),
    (["frobnicate"], "invalid choice"),
]


@pytest.mark.parametrize("argv, flag", BAD, ids=[" ".join(a) or "empty" for a, _ in BAD])
def test_cli_bad_flags(argv, flag, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert flag in captured.err
    assert "error:" in captured.err
    assert captured.out == ""  # nothing printed before the error
    assert not (tmp_path / "x.png").exists()


def test_python_dash_m_entry_point():
    result = subprocess.run(
        [sys.executable, "-m", "retrograde", "plan", "--steps", "100", "--snapshots", "5"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "Revolve(5)" in result.stdout and "316" in result.stdout


# ---------------------------------------------------------------------------------------------
# The picture
# ---------------------------------------------------------------------------------------------


def test_plot_schedule_api(tmp_path):
    path = tmp_path / "revolve.png"
    fig, stats = plot_schedule(Revolve(4), 40, path)
    assert path.stat().st_size > 10_000
    assert stats.plain == simulate(Revolve(4), 40).plain
    title = fig.axes[0].get_title()
    assert "N = 40" in title and "slots = 4" in title and f"plain {stats.plain}" in title


def test_plot_mixed_draws_linearize_and_reverse(tmp_path):
    fig, stats = plot_schedule(Mixed(4), 40, tmp_path / "mixed.png")
    assert stats == simulate(Mixed(4), 40)
    ax = fig.axes[0]
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert f"linearized evaluation, data kept ({stats.linearized})" in labels
    assert f"reversed from data ({stats.reversed})" in labels
    assert f"linearized {stats.linearized}" in ax.get_title()
    assert "reverse from data" in ax.get_xlabel()
    _fig, stats = plot_schedule(Revolve(4), 40, None)
    assert not any("data" in t.get_text() for t in _fig.axes[0].get_legend().get_texts())


def test_plot_large_n_uses_segments(tmp_path):
    # Long schedules draw fast because the advances are one LineCollection.
    fig, _stats = plot_schedule(Revolve(10), 2500, tmp_path / "big.png")
    ax = fig.axes[0]
    assert len(ax.collections) >= 1
    assert len(ax.lines) <= 3  # recorded line plus one store series per level


def test_plot_validates(tmp_path):
    class Broken(StoreAll):
        def actions(self, n_steps):
            yield from super().actions(n_steps)
            yield from super().actions(n_steps)

    with pytest.raises(ScheduleError):
        plot_schedule(Broken(), 5, tmp_path / "broken.png")
    with pytest.raises(TypeError, match="schedule"):
        plot_schedule(object(), 5, tmp_path / "x.png")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n_steps"):
        plot_schedule(Revolve(3), 10**7, tmp_path / "x.png")


def test_planner_does_not_import_jax():
    script = (
        "import importlib.abc, sys\n"
        "class Forbid(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('jax', 'jaxlib'):\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Forbid())\n"
        "from retrograde.__main__ import main\n"
        "main(['plan', '--steps', '100', '--snapshots', '5'])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "Revolve(5)" in result.stdout
