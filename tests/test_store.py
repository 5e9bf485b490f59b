"""The snapshot stores both drivers share (``retrograde._store``): one RAM store, one file store
(a private named directory or one unnamed file), the same checks and the same leaf sharing."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from retrograde._store import Disk, Memory, SnapshotError


def _states(n, size=64):
    table = np.arange(size, dtype=np.float64)  # never changes: shared
    return [[np.full(size, float(k)), table] for k in range(n)]


@pytest.mark.parametrize("spec", ["memory", "named", "unnamed"])
def test_put_get_free_and_sharing(spec, tmp_path):
    store = {
        "memory": lambda: Memory(),
        "named": lambda: Disk(tmp_path),
        "unnamed": lambda: Disk(tmp_path, unnamed=True),
    }[spec]().open("level 1 (test)")
    snaps = [store.put(k, s) for k, s in enumerate(_states(4))]
    assert store.writes == 4 and store.shared_leaves == 3
    assert store.nbytes == (4 + 1) * 64 * 8
    got = store.get(snaps[2])
    np.testing.assert_array_equal(got[0], np.full(64, 2.0))
    got[0][:] = -1  # the caller's own copy
    np.testing.assert_array_equal(store.get(snaps[2])[0], np.full(64, 2.0))
    view = store.get(snaps[1], copy=False)  # the compiled loops' read, copied to a device
    np.testing.assert_array_equal(view[0], np.full(64, 1.0))
    if spec == "memory":  # the store's own array, read-only
        assert not view[0].flags.writeable
    store.free(snaps[0])  # the shared table stays with the others
    np.testing.assert_array_equal(store.get(snaps[3])[1], np.arange(64.0))
    with pytest.raises(SnapshotError, match="step 0"):
        store.get(snaps[0])
    store.close()
    assert store.nbytes == 0
    assert list(tmp_path.iterdir()) == []


def test_unnamed_file_reuses_freed_space_and_shows_no_name(tmp_path):
    store = Disk(tmp_path, unnamed=True).open("level 1 (disk)")
    held = {}
    for k in range(20):  # two slots, rewritten in turn
        slot = k % 2
        if slot in held:
            store.free(held[slot])
        held[slot] = store.put(k, [np.full(100, float(k)), np.full(3, float(k))])
        assert os.listdir(tmp_path) == []
    file = store.placement.file
    assert os.fstat(file.fileno()).st_size <= 3 * 103 * 8  # two slots' space, and one spare
    np.testing.assert_array_equal(store.get(held[1])[0], np.full(100, 19.0))
    os.pwrite(file.fileno(), b"\x7f" * 16, held[0].leaves[0].offset)
    with pytest.raises(SnapshotError, match="snapshot of step 18 on disk failed its checksum"):
        store.get(held[0])
    store.close()
    assert store.placement.file is None and os.listdir(tmp_path) == []


def test_failed_write_is_absent_and_named(tmp_path):
    for unnamed in (False, True):
        store = Disk(tmp_path, unnamed=unnamed).open("level 1 (disk)")
        with pytest.raises(TypeError, match="leaf 1 at step 4 has dtype object"):
            store.put(4, [np.ones(3), np.array([object()])])
        assert store.nbytes == 0 and store.writes == 0
        store.close()
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_cannot_be_made_names_the_step(tmp_path):
    store = Disk(tmp_path).open("level 1 (disk)")
    os.rename(store.path, store.path + "-moved")  # the snapshot directory is gone
    try:
        with pytest.raises(OSError, match="cannot write the snapshot of step 7 of the level 1"):
            store.put(7, [np.ones(3)])
    finally:
        store.close()
        shutil.rmtree(store.path + "-moved")
    assert list(tmp_path.iterdir()) == []
