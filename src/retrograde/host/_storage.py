"""The host driver's ``storage=`` argument: one storage specification per schedule level.

The stores themselves (:class:`~retrograde._store.Memory`, :class:`~retrograde._store.Disk`) are
shared with the compiled loops and live below both drivers, in :mod:`retrograde._store`.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

from .._store import Disk, Memory, Storage, level_storage
from ..schedules import Level

__all__ = ["StorageSpec", "resolve_storage"]

#: What a ``storage=`` argument accepts (see :func:`resolve_storage`).
StorageSpec = Storage | str | Sequence[Storage | str] | Mapping[int | str, Storage | str] | None


def resolve_storage(storage: StorageSpec, levels: Sequence[Level]) -> list[Storage]:
    """One storage specification per schedule level.

    ``storage`` may be ``None`` (each level's own ``Level(storage=...)``, read by
    :func:`~retrograde._store.level_storage` as the compiled loops read it: ``"disk"`` levels on
    ``Disk(level.directory)``, ``"host"`` and ``"device"`` levels in :class:`Memory`; a level
    whose name says "disk" but whose storage does not is warned about), one
    :class:`Storage` for every level, the strings ``"memory"``/``"disk"``, a sequence with one
    entry per level, or a mapping from level index or level name to a storage.
    """
    n = len(levels)

    def one(s, where):
        if isinstance(s, Storage):
            return s
        if isinstance(s, str):
            key = s.lower()
            if key in ("memory", "ram", "host"):
                return Memory()
            if key == "disk":
                return Disk()
        raise TypeError(
            f"storage{where} must be retrograde.host.Memory(), retrograde.host.Disk(directory), "
            f"'memory' or 'disk'; got {s!r}."
        )

    if storage is None:
        for i, lvl in enumerate(levels):
            if lvl.storage != "disk" and "disk" in (lvl.name or "").lower():
                warnings.warn(
                    f"level {i} of the schedule is named {lvl.name!r} but is "
                    f"Level(storage={lvl.storage!r}): its snapshots are kept in memory (a level's "
                    "name no longer chooses disk). Give Level(..., storage='disk'), or "
                    "storage=retrograde.host.Disk(...) here.",
                    UserWarning,
                    stacklevel=4,
                )
        return [level_storage(lvl) for lvl in levels]
    if isinstance(storage, (Storage, str)):
        return [one(storage, "") for _ in levels]
    if isinstance(storage, Mapping):
        out = []
        names = [lvl.name for lvl in levels]
        for key in storage:
            if not (key in range(n) or key in names):
                raise ValueError(
                    f"storage has the key {key!r}, but the schedule's levels are "
                    f"{list(range(n))} named {names}; key the mapping by level index or name."
                )
        for i, lvl in enumerate(levels):
            if i in storage:
                out.append(one(storage[i], f"[{i}]"))
            elif lvl.name in storage:
                out.append(one(storage[lvl.name], f"[{lvl.name!r}]"))
            else:
                raise ValueError(
                    f"storage gives no store for level {i} ({lvl.name!r}) of the schedule; add "
                    f"storage[{i}] = Memory() or Disk(...)."
                )
        return out
    if isinstance(storage, Sequence):
        if len(storage) != n:
            raise ValueError(
                f"storage has {len(storage)} entries but the schedule has {n} levels; give one "
                "store per level."
            )
        return [one(s, f"[{i}]") for i, s in enumerate(storage)]
    raise TypeError(
        f"storage must be None, Memory(), Disk(...), a list with one per level, or a mapping "
        f"level -> store; got {storage!r}."
    )
