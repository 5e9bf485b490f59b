"""Snapshot storage: copies, leaf sharing, disk files, checksums, cleanup, errors, progress."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import retrograde.host as rh
from retrograde import schedules as rs
from retrograde.schedules import Advance, End, OfflineSchedule, Record, Restore, Store

from . import _host_problems as P

N = 12


class Boom(RuntimeError):
    pass


def _exploding_step(at):
    def fwd(n, s, p):
        if n == at:
            raise Boom(f"step {n} exploded")
        return P.np_forward(n, s, p)

    return rh.Step(fwd, P.np_vjp)


def _exploding_vjp(at):
    def vjp(n, s, p, b):
        if n == at:
            raise Boom(f"adjoint of step {n} exploded")
        return P.np_vjp(n, s, p, b)

    return rh.Step(P.np_forward, vjp)


def test_disk_directory_removed_after_normal_exit(tmp_path):
    with rh.forward(
        P.NP_STEP,
        P.state0(),
        P.params0(),
        N,
        schedule=rs.Revolve(4),
        loss=P.NP_LOSS,
        storage=rh.Disk(tmp_path),
    ) as fp:
        (sub,) = list(tmp_path.iterdir())
        assert sub.name.startswith("retrograde-")
        assert len(list(sub.glob("*.snap"))) >= 2
        fp.vjp()
        assert not list(sub.glob("*.tmp"))
    assert list(tmp_path.iterdir()) == []
    rh.value_and_grad(
        P.NP_STEP,
        P.NP_LOSS,
        P.state0(),
        P.params0(),
        N,
        schedule=rs.StoreAll(),
        storage=rh.Disk(tmp_path),
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("sched", [rs.StoreAll(), rs.Revolve(3)], ids=["StoreAll", "Revolve3"])
def test_disk_directory_removed_after_exception_in_a_step(sched, tmp_path):
    with pytest.raises(Boom):  # in the first sweep
        rh.value_and_grad(
            _exploding_step(7),
            P.NP_LOSS,
            P.state0(),
            P.params0(),
            N,
            schedule=sched,
            storage=rh.Disk(tmp_path),
        )
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(Boom):  # in the reverse sweep
        rh.value_and_grad(
            _exploding_vjp(3),
            P.NP_LOSS,
            P.state0(),
            P.params0(),
            N,
            schedule=sched,
            storage=rh.Disk(tmp_path),
        )
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(Boom):  # an exception in the user's with-block
        with rh.forward(
            P.NP_STEP, P.state0(), P.params0(), N, schedule=sched, storage=rh.Disk(tmp_path)
        ):
            assert list(tmp_path.iterdir())
            raise Boom("user code")
    assert list(tmp_path.iterdir()) == []


def test_disk_directory_removed_when_handle_is_dropped(tmp_path):
    fp = rh.forward(
        P.NP_STEP, P.state0(), P.params0(), N, schedule=rs.Revolve(3), storage=rh.Disk(tmp_path)
    )
    assert list(tmp_path.iterdir())
    del fp
    gc.collect()
    assert list(tmp_path.iterdir()) == []


def _snap_files(tmp_path, step):
    return [f for f in tmp_path.rglob("*.snap") if f.name.startswith(f"step{step}-")]


def test_corrupt_file_raises_checksum_error_naming_the_step(tmp_path):
    with rh.forward(
        P.NP_STEP,
        P.state0(),
        P.params0(),
        N,
        schedule=rs.StoreAll(),
        loss=P.NP_LOSS,
        storage=rh.Disk(tmp_path),
    ) as fp:
        (f,) = _snap_files(tmp_path, 5)
        data = bytearray(f.read_bytes())
        data[3] ^= 0x40
        f.write_bytes(bytes(data))
        with pytest.raises(
            rh.SnapshotError, match="snapshot of step 5 on disk failed its checksum"
        ):
            fp.vjp()
        # the error does not leave stray files of the reverse part, and close still cleans up
    assert list(tmp_path.iterdir()) == []


def test_missing_and_truncated_files(tmp_path):
    with rh.forward(
        P.NP_STEP,
        P.state0(),
        P.params0(),
        N,
        schedule=rs.StoreAll(),
        loss=P.NP_LOSS,
        storage=rh.Disk(tmp_path),
    ) as fp:
        (f,) = _snap_files(tmp_path, 8)
        f.unlink()
        with pytest.raises(rh.SnapshotError, match="snapshot of step 8 on disk is missing"):
            fp.vjp()
    with rh.forward(
        P.NP_STEP,
        P.state0(),
        P.params0(),
        N,
        schedule=rs.StoreAll(),
        loss=P.NP_LOSS,
        storage=rh.Disk(tmp_path),
    ) as fp:
        (f,) = _snap_files(tmp_path, 2)
        f.write_bytes(f.read_bytes()[:-5])
        with pytest.raises(rh.SnapshotError, match="snapshot of step 2 on disk is truncated"):
            fp.vjp()
    assert list(tmp_path.iterdir()) == []


class _BrokenSchedule(OfflineSchedule):
    """Restores a slot it never stored: the driver must refuse, not use a live value."""

    def actions(self, n_steps):
        yield Store(0, 0, 0)
        yield Advance(0, n_steps - 1)
        yield Record(n_steps - 1)
        yield Restore(n_steps - 2, 1, 0)
        yield Record(n_steps - 2)
        yield End()


def test_missing_snapshot_is_an_error_never_a_live_value():
    with pytest.raises(rh.SnapshotError, match="snapshot of step 10 is missing"):
        rh.value_and_grad(
            P.NP_STEP, P.NP_LOSS, P.state0(), P.params0(), N, schedule=_BrokenSchedule()
        )


def test_snapshots_are_copies_in_both_directions():
    """A step that mutates its input in place, and a step that returns its input aliased."""
    seen = []

    def fwd(n, u, a):
        seen.append(u)
        u *= 1.0 + 0.1 * a  # in place
        u += 0.01 * np.sin(u)
        return u

    def vjp(n, u, a, b):
        v = u * (1.0 + 0.1 * a)
        d = 1 + 0.01 * np.cos(v)
        return b * (1.0 + 0.1 * a) * d, np.sum(b * 0.1 * u * d)

    step = rh.Step(fwd, vjp)
    loss = rh.Final(lambda n, u, a: np.sum(u**2), grad=lambda n, u, a: (2 * u, 0.0))
    u0 = np.linspace(0.1, 1.0, 6)
    ref = rh.value_and_grad(step, loss, u0, 0.3, 15, schedule=rs.StoreAll())
    for sched in (rs.Revolve(2), rs.Revolve(4), rs.Periodic(3)):
        for storage in (rh.Memory(), rh.Disk()):
            J, g = rh.value_and_grad(step, loss, u0, 0.3, 15, schedule=sched, storage=storage)
            assert J == pytest.approx(ref[0], rel=1e-14)
            np.testing.assert_allclose(g.state0, ref[1].state0, rtol=1e-13)
            np.testing.assert_allclose(g.params, ref[1].params, rtol=1e-13)
    np.testing.assert_array_equal(u0, np.linspace(0.1, 1.0, 6))


@pytest.mark.parametrize("kind", ["memory", "disk"])
def test_unchanged_leaves_are_stored_once(kind, tmp_path):
    """A write-once buffer in the state is shared by every snapshot, not copied again."""
    big = np.random.default_rng(0).standard_normal(20_000)  # 160 kB, never changes

    def fwd(n, s, p):
        return {"u": s["u"] + 0.1 * np.sin(s["u"]) * p, "table": s["table"]}

    def vjp(n, s, p, b):
        return (
            {"u": b["u"] * (1 + 0.1 * np.cos(s["u"]) * p), "table": b["table"]},
            np.sum(b["u"] * 0.1 * np.sin(s["u"])),
        )

    step = rh.Step(fwd, vjp)
    loss = rh.Final(
        lambda n, s, p: np.sum(s["u"] ** 2) + s["table"][0],
        grad=lambda n, s, p: ({"u": 2 * s["u"], "table": np.eye(1, big.size)[0]}, 0.0),
    )
    s0 = {"u": np.linspace(0, 1, 10), "table": big}
    storage = rh.Memory() if kind == "memory" else rh.Disk(tmp_path)
    with rh.forward(step, s0, 0.5, 30, schedule=rs.StoreAll(), loss=loss, storage=storage) as fp:
        store = fp._stores[0]
        assert fp.counts.writes == (29,)
        assert fp.counts.shared_leaves == (28,)
        assert store.nbytes < big.nbytes + 29 * 10 * 8 + 1024
        if kind == "disk":
            size = sum(f.stat().st_size for f in tmp_path.rglob("*.snap"))
            assert size == store.nbytes
        g = fp.vjp()
    _J2, g2 = rh.value_and_grad(step, loss, s0, 0.5, 30, schedule=rs.Revolve(3))
    np.testing.assert_allclose(g.params, g2.params, rtol=1e-13)
    np.testing.assert_allclose(g.state0["table"], g2.state0["table"])
    assert g.state0["table"][0] == 1.0


def test_shared_leaf_survives_freeing_the_snapshot_that_wrote_it(tmp_path):
    """Disk: a file stays while a later snapshot still references a leaf in it."""
    store = rh.Disk(tmp_path).open()
    import jax

    a = {"x": np.arange(4.0), "k": np.ones(3)}
    leaves, treedef = jax.tree_util.tree_flatten(a)
    s1 = store.put(1, leaves, treedef)
    leaves2, _ = jax.tree_util.tree_flatten({"x": np.arange(4.0) + 1, "k": np.ones(3)})
    s2 = store.put(2, leaves2, treedef)
    assert store.shared_leaves == 1
    store.free(s1)
    got = store.get(s2)
    np.testing.assert_array_equal(got[0], np.ones(3))
    np.testing.assert_array_equal(got[1], np.arange(4.0) + 1)
    assert len(list(tmp_path.rglob("*.snap"))) == 2  # s1's file is still referenced
    store.free(s2)
    assert list(tmp_path.rglob("*.snap")) == []
    with pytest.raises(rh.SnapshotError, match="step 2"):
        store.get(s2)
    store.close()
    assert list(tmp_path.iterdir()) == []


def test_mpi_rank_in_names(tmp_path, monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")
    d = rh.Disk(tmp_path)
    assert d.rank == 3
    with rh.forward(P.NP_STEP, P.state0(), P.params0(), 5, schedule=rs.StoreAll(), storage=d) as fp:
        (sub,) = list(tmp_path.iterdir())
        assert sub.name.startswith("retrograde-r3-")
        assert sorted(f.name for f in sub.iterdir() if not f.name.startswith("r3-step")) == [
            "owner"
        ]
        fp.vjp({"u": np.ones(P.M), "memo": np.zeros(P.M)})
    assert rh.Disk(rank=1).rank == 1


def test_multilevel_places_snapshots_on_both_levels(tmp_path):
    ml = P.multilevel()
    with rh.forward(
        P.NP_STEP,
        P.state0(),
        P.params0(),
        20,
        schedule=ml,
        loss=P.NP_LOSS,
        storage={"memory": rh.Memory(), "disk": rh.Disk(tmp_path)},
    ) as fp:
        fp.vjp()
        assert fp.counts.writes[0] > 0 and fp.counts.writes[1] > 0
        assert fp.counts.reads[1] > 0
        assert fp._stores[0].kind == "memory"
        assert fp._stores[1].kind == "disk" and fp._stores[1].path.startswith(str(tmp_path))
    # default storage: each level's Level(storage=...), as in the compiled loops
    with rh.forward(P.NP_STEP, P.state0(), P.params0(), 20, schedule=ml) as fp:
        assert [s.kind for s in fp._stores] == ["memory", "disk"]
    # explicit mapping by level index
    with rh.forward(
        P.NP_STEP,
        P.state0(),
        P.params0(),
        20,
        schedule=ml,
        storage={0: rh.Memory(), 1: rh.Memory()},
    ) as fp:
        assert fp._stores[1].kind == "memory"
    assert list(tmp_path.iterdir()) == []


def test_default_storage_follows_level_storage_not_the_name(tmp_path):
    """With no storage=, the host driver reads Level(storage=...) as the compiled loops do: "disk"
    on Disk(level.directory), "host" and "device" in memory; the name is a label (a level named
    "disk" that is not storage="disk" stays in memory, with a warning)."""
    levels = [
        rs.Level(1, name="fast"),
        rs.Level(2, 0.5, 0.5, name="slow", storage="host"),
        rs.Level(None, 1, 1, name="far", storage="disk", directory=tmp_path / "d"),
    ]
    with rh.forward(
        P.NP_STEP, P.state0(), P.params0(), 20, schedule=rs.MultiLevel(levels), loss=P.NP_LOSS
    ) as fp:
        assert [s.kind for s in fp._stores] == ["memory", "memory", "disk"]
        assert fp._stores[2].path.startswith(str(tmp_path / "d"))
        g = fp.vjp()
        assert fp.counts.writes[2] > 0
    assert list((tmp_path / "d").iterdir()) == []
    ref = rh.value_and_grad(
        P.NP_STEP, P.NP_LOSS, P.state0(), P.params0(), 20, schedule=rs.StoreAll()
    )
    np.testing.assert_allclose(g.params["a"], ref[1].params["a"], rtol=1e-12)
    named = rs.MultiLevel([rs.Level(1), rs.Level(None, 1, 1, name="disk")])
    with pytest.warns(UserWarning, match="name no longer chooses disk"):
        with rh.forward(P.NP_STEP, P.state0(), P.params0(), 20, schedule=named) as fp:
            assert [s.kind for s in fp._stores] == ["memory", "memory"]


def test_both_drivers_read_level_storage_alike():
    """One function reads Level(storage=...) for the host driver and the compiled loops."""
    from retrograde._store import Disk, Memory, level_storage

    assert type(level_storage(rs.Level(2))) is Memory
    assert type(level_storage(rs.Level(2, storage="host"))) is Memory
    d = level_storage(rs.Level(2, storage="disk", directory="/some/where"), unnamed=True)
    assert type(d) is Disk and d.directory == "/some/where" and d.unnamed
    assert not level_storage(rs.Level(2, storage="disk")).unnamed


def test_progress_bar(capsys):
    rh.value_and_grad(
        P.NP_STEP, P.NP_LOSS, P.state0(), P.params0(), 30, schedule=rs.Revolve(3), progress=True
    )
    err = capsys.readouterr().err
    assert "forward" in err and "reverse" in err
    rh.value_and_grad(
        P.NP_STEP, P.NP_LOSS, P.state0(), P.params0(), 30, schedule=rs.Revolve(3)
    )  # stderr is not a terminal under pytest
    assert capsys.readouterr().err == ""
    with pytest.raises(TypeError, match="progress"):
        rh.value_and_grad(
            P.NP_STEP, P.NP_LOSS, P.state0(), P.params0(), 3, schedule=rs.Revolve(3), progress="yes"
        )


def test_argument_errors(tmp_path):
    s0, p = P.state0(), P.params0()
    with pytest.raises(TypeError, match="loss must be"):
        rh.value_and_grad(P.NP_STEP, lambda n, s, p: 0.0, s0, p, 3, schedule=rs.Revolve(2))
    with pytest.raises(ValueError, match="online schedule"):
        rh.forward(P.NP_STEP, s0, p, None, until=lambda n, s: n > 3, schedule=rs.Revolve(2))
    with pytest.raises(TypeError, match="schedule must be"):
        rh.forward(P.NP_STEP, s0, p, 3, schedule=5)
    with pytest.raises(ValueError, match="n_steps=-1"):
        rh.forward(P.NP_STEP, s0, p, -1, schedule=rs.Revolve(2))
    with pytest.raises(TypeError, match="storage"):
        rh.forward(P.NP_STEP, s0, p, 3, schedule=rs.Revolve(2), storage=42)
    with pytest.raises(ValueError, match="levels"):
        rh.forward(P.NP_STEP, s0, p, 3, schedule=rs.Revolve(2), storage={7: rh.Memory()})
    with pytest.raises(TypeError, match="Step"):
        rh.forward(42, s0, p, 3, schedule=rs.Revolve(2))
    with pytest.raises(TypeError, match="forward"):
        rh.Step(None, P.np_vjp)
    with pytest.raises(TypeError, match="hvp needs a JAX step"):
        rh.hvp(P.NP_STEP, P.NP_LOSS, s0, p, 3, p, schedule=rs.Revolve(2))
    with rh.forward(P.NP_STEP, s0, p, 3, schedule=rs.Revolve(2)) as fp:
        with pytest.raises(ValueError, match="state_bar"):
            fp.vjp()
        with pytest.raises(ValueError, match="loss_bar"):
            fp.vjp({"u": np.ones(P.M), "memo": np.ones(P.M)}, loss_bar=1.0)
        with pytest.raises(TypeError, match="structure"):
            fp.vjp({"u": np.ones(P.M)})
    with pytest.raises(ValueError, match="closed"):
        fp.vjp({"u": np.ones(P.M), "memo": np.ones(P.M)})
    assert fp.closed
    fp.close()  # idempotent
    with pytest.raises(ValueError, match=r"directory|Disk"):
        rh.Disk(tmp_path, rank=-1)


def test_failed_disk_write_leaves_no_partial_file(tmp_path):
    """A leaf that cannot be written aborts the write: no .tmp or half-written snapshot stays."""
    store = rh.Disk(tmp_path).open()
    import jax

    leaves, treedef = jax.tree_util.tree_flatten([np.ones(3), np.array([object()])])
    with pytest.raises(TypeError, match="leaf 1 at step 4 has dtype object"):
        store.put(4, leaves, treedef)
    (sub,) = list(tmp_path.iterdir())
    assert [f.name for f in sub.iterdir()] == ["owner"]
    store.close()
    assert list(tmp_path.iterdir()) == []
