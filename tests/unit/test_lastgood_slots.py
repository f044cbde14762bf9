"""The rollback copy's recycled staging files: a superseded copy is written over through a kept mapping, and is
never read as a copy once it stopped being the last good one."""

import os

import torch

from labkit.sync import lastgood
from labkit.sync.slots import Slots


def _named(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"a.weight": torch.randn(33, 7, generator=g), "b.bias": torch.randn(5, generator=g).to(torch.bfloat16),
            "c": torch.randn(1000, generator=g)}


def _write(store, slots, named, version, capacity=0):
    w = lastgood.Writer(store.staging(), slots, capacity)
    w.add(dict(list(named.items())[:1]))
    w.add(dict(list(named.items())[1:]))
    return w.finish(version)


def test_store_recycles_the_superseded_copy_and_the_mapping_round_trips_bitwise(tmp_path):
    store, slots = lastgood.Store(tmp_path), Slots()
    p1 = _write(store, slots, _named(1), "v1", capacity=64)  # too small: the writer grows the file
    store.promote(p1, "v1", {})
    p2 = _write(store, slots, _named(2), "v2")
    store.promote(p2, "v2", {})
    assert store.spare == p1 and not lastgood.is_complete(p1)  # superseded: never read as a copy again
    staging = store.staging()
    assert staging == p1 and store.spare is None
    mapped = slots.files[os.path.join(p1, "data.bin")][1]
    w = lastgood.Writer(staging, slots)
    assert w._buf is mapped  # the same mapping: no page faulted in afresh
    w.add(_named(3))
    store.promote(w.finish("v3"), "v3", {})
    version, back = lastgood.load(p1)
    assert version == "v3" and all(torch.equal(back[n], t) for n, t in _named(3).items())
    assert store.spare == p2 and lastgood.load(p1)[0] == "v3"
    store.close()
    slots.get(tmp_path / "other.bin", 128)  # a removed copy's mapping is let go at the next get
    assert set(slots.files) == {str(tmp_path / "other.bin")}


def test_a_shorter_copy_over_a_longer_file_reads_only_its_own_bytes(tmp_path):
    """A recycled data.bin is never shrunk (SIGBUS under a mapping): the index's nbytes bounds what is read, and
    an appended tensor (`extend`, a partial sync) goes right after it, not after the stale tail."""
    store, slots = lastgood.Store(tmp_path), Slots()
    store.promote(_write(store, slots, {"big": torch.randn(4096), "x": torch.randn(3)}, "v1"), "v1", {})
    store.promote(_write(store, slots, {"big": torch.randn(4096), "x": torch.randn(3)}, "v2"), "v2", {})
    small = {"x": torch.randn(3)}
    p3 = _write(store, None, small, "v3")  # the driver's own writer (no mapping) over the recycled file
    assert os.path.getsize(os.path.join(p3, "data.bin")) > 4096 * 4
    store.promote(p3, "v3", {})  # carries "big" over from v2, appended after x
    version, back = lastgood.load(p3)
    assert version == "v3" and set(back) == {"big", "x"} and torch.equal(back["x"], small["x"])


def test_without_spare_the_superseded_copy_is_removed_and_a_failed_one_is_not_a_copy(tmp_path):
    store = lastgood.Store(tmp_path, spare=False)
    p1 = lastgood.write(store.staging(), {"x": torch.ones(2)}, "v1")
    store.promote(p1, "v1", {})
    store.promote(lastgood.write(store.staging(), {"x": torch.zeros(2)}, "v2"), "v2", {})
    assert not os.path.exists(p1) and store.spare is None
    (tmp_path / "k").mkdir()
    kept = lastgood.Store(tmp_path / "k")
    p = lastgood.write(kept.staging(), {"x": torch.ones(2)}, "v1")
    kept.discard(p)  # a failed sync's staging: kept for reuse, but no longer a copy
    assert kept.spare == p and not lastgood.is_complete(p) and kept.staging() == p


def test_a_sync_that_turns_the_spare_off_frees_it(tmp_path):
    store = lastgood.Store(tmp_path)
    p1 = lastgood.write(store.staging(), {"x": torch.ones(2)}, "v1")
    store.promote(p1, "v1", {})
    store.promote(lastgood.write(store.staging(), {"x": torch.zeros(2)}, "v2"), "v2", {})
    assert store.spare == p1
    assert store.staging(spare=False) != p1 and not os.path.exists(p1)  # SyncConfig(stage_spare=False)


def test_a_new_store_removes_the_copies_of_dead_drivers_of_its_pid_namespace_only(tmp_path):
    """A SIGKILLed driver leaves a model's worth of tmpfs behind; the next store removes it. A copy made in
    another pid namespace (a container sharing /dev/shm) is kept: its live driver's pid is not seen from here,
    and removing it would take that driver's rollback copy away mid-run."""
    import subprocess
    import sys

    from labkit.pids import namespace

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # its pid is now free
    ns, pre = namespace(), lastgood.STAGE_PREFIX
    dead, alive = tmp_path / f"{pre}pid-{ns}.{child.pid}-a", tmp_path / f"{pre}pid-{ns}.{os.getpid()}-b"
    elsewhere, old_form = tmp_path / f"{pre}pid-1.{child.pid}-c", tmp_path / f"{pre}{child.pid}_d"
    for d in (dead, alive, elsewhere, old_form):
        (d / "s1").mkdir(parents=True)
    store = lastgood.Store(tmp_path)
    assert store.root.name.startswith(f"{pre}pid-{ns}.{os.getpid()}-")
    assert not dead.exists() and alive.exists() and elsewhere.exists() and old_form.exists()
    store.close()
