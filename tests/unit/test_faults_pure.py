"""Pure parts of the reliability layer: failpoints, the host copy format, trial planning, config validation,
the pre-send tensor check and the rendezvous port retry (a real TCPStore on loopback, no Ray, no engine)."""

import socket

import pytest
import torch

from labkit.engine.errors import EngineError
from labkit.engine.contract import check_tensors
from labkit.lab.faults.plan import KINDS, QUICK_KINDS, FaultsConfig, plan_trials
from labkit import failpoints as fp
from labkit.sync import lastgood
from labkit.sync import verify as vf
from labkit.sync.session import SyncConfig


@pytest.fixture(autouse=True)
def _clean():
    fp.disarm()
    yield
    fp.disarm()


def test_failpoint_fires_once_on_the_nth_hit():
    fp.arm("sync.bucket", "raise", nth=3)
    fp.hit("sync.bucket")
    fp.hit("sync.bucket")
    with pytest.raises(fp.FaultInjected, match="sync.bucket"):
        fp.hit("sync.bucket")
    fp.hit("sync.bucket")  # fired already: a failpoint is one fault
    fp.hit("sync.end")  # not armed: nothing
    assert fp.disarm() == {"sync.bucket": True}


def test_failpoint_wait_writes_marker_and_returns_when_the_gate_goes(tmp_path):
    import threading

    marker, gate = tmp_path / "m", tmp_path / "g"
    gate.touch()
    fp.arm("sync.begin", "wait", marker=str(marker), gate=str(gate), limit_s=30)
    th = threading.Thread(target=fp.hit, args=("sync.begin",))
    th.start()
    for _ in range(200):
        if marker.exists():
            break
        th.join(0.05)
    assert marker.exists() and th.is_alive()
    gate.unlink()
    th.join(5)
    assert not th.is_alive()


@pytest.mark.parametrize("kw,match", [({"point": "sync.nowhere", "action": "raise"}, "point="),
                                      ({"point": "sync.end", "action": "explode"}, "action="),
                                      ({"point": "sync.end", "action": "raise", "nth": 0}, "nth=0"),
                                      ({"point": "sync.end", "action": "wait"}, "marker=")])
def test_bad_failpoints_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        fp.arm(**kw)


def test_port_in_use_is_retried_on_another_port(monkeypatch):
    """The rendezvous store binds before the engine hears the port: a squatter costs one retry, nothing else."""
    from labkit.sync import transport

    fp.arm("transport.open", "squat")
    store, port, retries = transport.bind_store("127.0.0.1", 2, timeout_s=5)
    assert retries == 1 and port > 0
    store.set("k", "v")
    assert store.get("k") == b"v"
    del store


def test_every_port_taken_names_the_ports(monkeypatch):
    from labkit.sync import transport

    held = []

    def taken():
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        held.append(s)
        return s.getsockname()[1]

    monkeypatch.setattr("labkit.cluster.runtime.free_port", taken)
    with pytest.raises(RuntimeError, match="were all in use"):
        transport.bind_store("127.0.0.1", 2, timeout_s=5, attempts=2)
    for s in held:
        s.close()


def test_host_copy_round_trips_bitwise_and_an_unfinished_one_is_not_a_copy(tmp_path):
    named = {"a.weight": torch.randn(3, 5), "b.bias": torch.randn(7).to(torch.bfloat16),
             "model.layers.0.self_attn.q_proj.weight": torch.randn(4, 4), "scalar": torch.tensor(2.0)}
    w = lastgood.Writer(tmp_path / "c1")
    w.add(dict(list(named.items())[:2]))
    assert not lastgood.is_complete(tmp_path / "c1")  # a writer killed here leaves no usable copy
    w.add(dict(list(named.items())[2:]))
    w.finish("v7")
    version, back = lastgood.load(tmp_path / "c1")
    assert version == "v7" and set(back) == set(named)
    for n, t in named.items():
        assert back[n].dtype == t.dtype and torch.equal(back[n], t)
    assert vf.expected_checksums(back) == vf.expected_checksums(named)


def test_store_keeps_one_last_good_copy(tmp_path):
    store = lastgood.Store(tmp_path)
    p1 = lastgood.write(store.staging(), {"x": torch.ones(2)}, "v1")
    store.promote(p1, "v1", {"x": "aa"})
    p2 = lastgood.write(store.staging(), {"x": torch.zeros(2)}, "v2")
    store.promote(p2, "v2", {"x": "bb"})
    assert not lastgood.is_complete(p1) and lastgood.is_complete(p2)  # p1: the spare, no longer a copy
    assert torch.equal(store.tensors("float32")["x"], torch.zeros(2))
    store.discard(p2)  # the last good copy is never discarded
    assert lastgood.is_complete(p2)
    store.close()
    assert not store.root.exists()


def test_trials_cover_every_kind_evenly_with_valid_points():
    n = FaultsConfig().trials
    trials = plan_trials(n, seed=0)
    counts = {k: sum(t.kind == k for t in trials) for k in KINDS}
    assert n >= 30 and len(KINDS) >= 8 and set(counts.values()) == {n // len(KINDS)}
    assert counts["apply_crash"] + counts["apply_hang"] >= 5 and counts["corrupt_in_transit"] >= 3
    assert plan_trials(n, seed=0) == trials and plan_trials(n, seed=1) != trials
    assert {t.transport for t in trials} == {"per-tensor", "colocated", "distributed", "direct"}
    for t in trials:
        if t.kind in ("peer_hang", "peer_absent", "port_in_use") or t.point == "transport.send":
            assert t.transport == "distributed" or t.kind == "corrupt_in_transit"
        if t.kind in ("corrupt_in_transit", "trainer_killed_packing"):
            assert t.transport in ("colocated", "distributed")  # only a flattened transport packs a bucket
        if t.transport == "direct":  # no bucket, no engine apply, no rendezvous: the trainer's and engine's faults
            assert t.kind in ("exception", "trainer_killed", "engine_killed", "bad_tensor")
        assert (t.point is None) == (t.kind == "bad_tensor")
        if t.point is not None:
            fp.Armed(t.point, t.action, marker="m", gate="g")  # a point and action the failpoints know
    assert {t.kind for t in plan_trials(len(QUICK_KINDS), 3, QUICK_KINDS)} == set(QUICK_KINDS)


def test_corrupt_flips_one_byte_and_skip_tells_the_caller():
    flat = torch.zeros(64, dtype=torch.uint8)
    fp.arm("transport.send", "corrupt", nth=2)
    fp.hit("transport.send", flat=flat)
    assert int(flat.count_nonzero()) == 0
    fp.hit("transport.send", flat=flat)
    assert int(flat.count_nonzero()) == 1
    fp.arm("transport.peer", "skip")
    assert fp.hit("transport.peer") is True and fp.hit("transport.peer") is False


def test_engine_points_are_armed_for_the_child_process_that_applies(tmp_path):
    """engine.apply fires in SGLang's scheduler, a child of the process that armed it, on the nth match."""
    import subprocess
    import sys

    fp.arm("engine.apply", "raise", nth=2, match=".k_proj.")
    child = ("from labkit import failpoints as fp\n"
             "assert fp.engine_armed('engine.apply')\n"
             "for n in ['l0.q_proj.w', 'l0.k_proj.w', 'l1.q_proj.w']: fp.hit('engine.apply', name=n)\n"
             "try:\n    fp.hit('engine.apply', name='l1.k_proj.w')\nexcept fp.FaultInjected:\n    print('FIRED')\n")
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert "FIRED" in out.stdout, out.stderr
    fp.disarm()
    out = subprocess.run([sys.executable, "-c", "from labkit import failpoints as fp; "
                          "print(fp.engine_armed('engine.apply'))"], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_an_arming_file_left_by_a_dead_process_arms_no_later_process_with_its_pid():
    """pids wrap: the file of an engine actor killed while armed must not arm the next actor given that pid
    (a `crash` left so made a later engine's scheduler exit 70 while loading its model)."""
    import json
    import os
    import subprocess
    import sys

    fp.ARM_DIR.mkdir(exist_ok=True)
    me = os.getpid()
    stale = fp.ARM_DIR / f"{me}-{fp._started(me) - 1}.json"  # this pid, an earlier process's start time
    legacy = fp.ARM_DIR / f"{me}.json"  # the name such files had before they carried a start time
    for f in (stale, legacy):
        f.write_text(json.dumps({"point": "engine.apply", "action": "crash"}))
    child = "from labkit import failpoints as fp; print(fp.engine_armed('engine.apply'))"
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
    fp.arm("engine.apply", "raise", match=".k_proj.")  # arming sweeps what dead (or older) processes left
    assert not stale.exists() and not legacy.exists() and fp._arm_file(me).exists()
    fp.disarm()
    assert not fp._arm_file(me).exists()


@pytest.mark.parametrize("kw,match", [({"trials": 0}, "trials=0"), ({"trials": 2.5}, "trials=2.5"),
                                      ({"seed": -1}, "seed=-1"), ({"deadline_s": 0}, "deadline_s=0")])
def test_bad_faults_config_is_refused_naming_the_value(kw, match):
    with pytest.raises(ValueError, match=match):
        FaultsConfig(**kw)


@pytest.mark.parametrize("kw,match", [({"timeout_s": 0}, "timeout_s=0"), ({"deadline_s": -1}, "deadline_s=-1"),
                                      ({"timeout_s": 60, "deadline_s": 30}, "deadline_s=30"),
                                      ({"atomic": "yes"}, "atomic='yes'")])
def test_bad_sync_timeouts_are_refused_naming_the_value(kw, match):
    with pytest.raises(ValueError, match=match):
        SyncConfig(**kw)


def test_update_check_names_every_bad_tensor_before_sending():
    spec = {"a.weight": ((4, 4), "float32"), "b.weight": ((2,), "float32")}
    check_tensors(spec, [("a.weight", (4, 4))], "update")
    check_tensors(None, [("anything", (1,))], "update")  # a remote engine: nothing to check against
    with pytest.raises(EngineError, match=r"'c.weight': not a weight.*'b.weight': shape \(3,\) != engine \(2,\)"):
        check_tensors(spec, [("c.weight", (1,)), ("b.weight", (3,))], "update_weights_from_tensor")


def test_a_partial_copy_is_completed_from_the_previous_good_one(tmp_path):
    """A sync with exclude= writes only what it sent; the last good copy must stay the whole model, or a later
    failed full sync could not restore the left-out tensors."""
    store = lastgood.Store(tmp_path)
    full = {"a": torch.randn(3), "b": torch.randn(2, 2), "draft.w": torch.randn(4)}
    store.promote(lastgood.write(store.staging(), full, "v1"), "v1", {"x": "1"})
    partial = {"a": torch.randn(3), "b": torch.randn(2, 2)}
    p2 = lastgood.write(store.staging(), partial, "v2")
    store.promote(p2, "v2", {"x": "2"})
    version, back = lastgood.load(p2)
    assert version == "v2" and set(back) == set(full)
    assert torch.equal(back["draft.w"], full["draft.w"]) and torch.equal(back["a"], partial["a"])
    store.close()


def test_delta_trials_are_drawn_for_flattened_transports_of_the_kinds_that_reach_a_payload():
    from labkit.lab.faults.plan import DELTA_KINDS, FLATTENED

    trials = plan_trials(66, seed=0)
    delta = [t for t in trials if t.delta]
    assert delta and {t.kind for t in delta} <= set(DELTA_KINDS) and {t.transport for t in delta} <= set(FLATTENED)
    assert any(t.kind in ("apply_crash", "apply_hang") for t in delta)  # an engine fault on a delta payload


def test_a_trial_counts_only_when_its_fault_fired_and_half_updated_has_one_meaning():
    from labkit.lab.faults.plan import counted, half_updated, summarize

    row = {"kind": "port_in_use", "transport": "distributed", "point": "transport.open", "fired": False,
           "recovered": True, "state": "new", "serving": True, "version_ok": True, "restored": False,
           "served_mid_sync": False, "next_sync_verified": True, "modified_then_restored": False,
           "engine_restarted": False, "recover_s": 0.0}
    assert not counted(row) and counted({**row, "fired": True})
    assert half_updated({**row, "state": "neither", "serving": False})  # a dead engine holding a mix counts too
    out = summarize([row, {**row, "fired": True}], FaultsConfig(trials=2), 1.0, {})
    assert out["faults/trials"] == 2 and out["faults/fired"] == 1 and out["faults/recovered"] == 1
    assert out["faults/per_kind"]["port_in_use"]["fired"] == 1


def test_every_action_writes_its_marker_as_it_fires(tmp_path):
    marker = tmp_path / "reached"
    fp.arm("sync.bucket", "raise", nth=2, marker=str(marker))
    try:
        assert fp.hit("sync.bucket") is False and not marker.exists()  # the first hit is not the nth
        with pytest.raises(fp.FaultInjected):
            fp.hit("sync.bucket")
        assert marker.read_text().startswith("sync.bucket ")
    finally:
        assert fp.disarm() == {"sync.bucket": True}


@pytest.mark.parametrize("case", ["held", "answered", "killed"])
def test_served_mid_sync_is_an_answer_before_the_hold_ends(tmp_path, monkeypatch, case):
    """An engine that holds a request until the sync is released did not serve mid-sync; one that answers while
    the sync is held did; a kill ends the hold (the guard restores and serves), so an answer after it does not
    count as served mid-sync."""
    import threading

    import ray

    from labkit.lab.faults import harness

    gate, marker, over = tmp_path / "gate", tmp_path / "marker", threading.Event()
    gate.touch()
    marker.write_text("sync.begin 1\n")

    class Engine:
        def portable(self, call_timeout_s):
            return self

        def generate(self, **kw):
            while case != "answered" and gate.exists() and not over.is_set():
                threading.Event().wait(0.01)

    monkeypatch.setattr(harness, "PROBE_S", 0.2)
    monkeypatch.setattr(ray, "kill", lambda actor, no_restart: over.set())  # the sync ends at the kill
    killer = harness.Killer(str(marker), str(gate), Engine(), object() if case == "killed" else None, limit_s=5)
    killer.start()
    killer.join(timeout=5)
    threading.Event().wait(0.1)  # a held probe is answered once the hold ends
    assert not gate.exists() and killer.released_at is not None and killer.killed is (case == "killed")
    assert killer.served is (case == "answered")
