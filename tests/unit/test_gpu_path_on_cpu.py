"""The GPU data path's bugs, caught on CPU: a buffer on another device (meta stands in for CUDA), SGLang imported
where it is not used (an import blocker stands in for the GPU machine, which has torch but no SGLang or Ray), the
compiled-plan table that dropped a whole sync's plans, labkit's device hash, CUDA-IPC handles with device UUIDs."""

import importlib
import io
import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from labkit.engine import ipc
from labkit.engine.inside import apply
from labkit.engine.inside import copyplan
from labkit.engine import checksum as ck

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def fresh():
    importlib.reload(copyplan)
    importlib.reload(apply)
    yield


def test_sources_point_at_the_buffer_on_its_own_device():
    """`_sources` built a CPU tensor over the received storage: with a CUDA buffer torch raised "Attempted to set
    the storage of a tensor on device cpu to a storage on different device"."""
    key = apply.layout_key([("a", "bfloat16", (2, 4), 0, 16), ("b", "float32", (3,), 16, 28)])
    flat = torch.empty(64, dtype=torch.uint8, device="meta")
    views = apply._sources(flat, key, copyplan.CopyPlan(json.loads(key[len(apply.PREFIX):])))
    assert [v.device.type for v in views] == ["meta", "meta"]
    assert [tuple(v.shape) for v in views] == [(2, 4), (3,)] and views[0].dtype == torch.bfloat16


def test_a_sync_of_many_buckets_keeps_every_plan_compiled(monkeypatch):
    """The plan table was cleared past 64 layouts: a 75-bucket sync compiled every plan again every sync."""
    p = torch.nn.Parameter(torch.zeros(100, 4), requires_grad=False)
    model = torch.nn.Module()
    model.register_parameter("w", p)
    model.param_view = lambda name: ("w", p.data[int(name)])
    keys = [apply.layout_key([(str(i), "float32", (4,), 0, 16)]) for i in range(100)]
    first = [copyplan.plan_for(model, k) for k in keys]
    compiled = []
    monkeypatch.setattr(copyplan, "_compile", lambda m, k: compiled.append(k))
    assert [copyplan.plan_for(model, k) for k in keys] == first and not compiled


def test_device_hash_sees_one_word_and_only_the_bytes(monkeypatch):
    t = torch.randn(1001, generator=torch.Generator().manual_seed(0)).bfloat16()  # odd byte count: padded tail
    h = ck.device_checksum(t)
    assert h.startswith(ck.DEVICE_PREFIX) and h == ck.device_checksum(t.clone())
    assert h == ck.device_checksum(t.view(torch.int16))  # bytes, not values
    for i in (0, 500, 1000):
        u = t.clone()
        u.view(torch.int16)[i] ^= 1
        assert ck.device_checksum(u) != h, i
    assert ck.device_checksum(t.flip(0)) != h  # positions count
    assert ck.device_checksum(torch.cat([t, t.new_zeros(1)])) != h  # length counts
    monkeypatch.setattr(ck, "CHUNK_WORDS", 7)  # chunked sums: the same value
    assert ck.device_checksum(t) == h
    assert ck.checksum(t, "device") == h and ck.checksum(t, "xxh3_64").startswith(ck.PREFIX)


def _globals(payload: bytes) -> set[tuple[str, str]]:
    """(module, name) of every global the payload loads."""
    seen = set()

    class Recorder(pickle.Unpickler):
        def find_class(self, module, name):
            seen.add((module, name))
            return super().find_class(module, name)

    Recorder(io.BytesIO(payload)).load()
    return seen


def test_ipc_payloads_are_what_sglang_admits_and_read_back():
    from sglang.srt.utils.common import MultiprocessingSerializer, SafeUnpickler

    assert ipc.ALLOWED <= SafeUnpickler.ALLOWED_GLOBALS, sorted(ipc.ALLOWED - SafeUnpickler.ALLOWED_GLOBALS)
    flat = torch.arange(64, dtype=torch.uint8).share_memory_()
    # One read per payload: writing a shm handle takes a reference to its file that the read gives back (torch's
    # file_system strategy), so a payload never read, or read twice, would leave the file behind or drop it early.
    assert _globals(ipc.dumps([("labkit-flat/1:[]", flat)])) <= ipc.ALLOWED
    for got in (ipc.loads(ipc.dumps([("k", flat)])), ipc.loads(ipc.dumps_str([("k", flat)])),
                MultiprocessingSerializer.deserialize(ipc.dumps([("k", flat)]))):
        assert torch.equal(got[0][1], flat)
    with pytest.raises(pickle.UnpicklingError, match="posix.system is not one"):
        ipc.loads(pickle.dumps(os.system))


def test_a_cuda_handle_names_its_device_by_uuid():
    with pytest.raises(ValueError, match="GPU-0000.*does not see"):
        ipc.device_index("GPU-0000")
    assert ipc.device_index(3) == 3  # torch's own handles (and SGLang's unpatched ones) stay indices


BLOCKED = """
import importlib.abc, sys
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("sglang", "sgl_kernel", "ray", "megatron", "mbridge"):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: the GPU machine has none)")
sys.meta_path.insert(0, Blocker())
"""


def test_the_data_path_runs_with_torch_alone(tmp_path):
    """Colocated, apply, checksums, delta and the direct transport's refusal import nothing they do not use."""
    (tmp_path / "sitecustomize.py").write_text(BLOCKED)
    script = textwrap.dedent("""
        import torch
        from labkit.engine import checksum as ck, ipc
        from labkit.engine.inside import apply
        from labkit.engine.inside import delta
        from labkit.sync import bucket, hooks, session, verify
        from labkit.sync.transports.colocated import Colocated
        from labkit.sync.transports.direct import Direct, Mappings
        from labkit.lab.device.engine import StandIn
        from labkit.engine.errors import Unsupported
        m = StandIn([("model.layers.0.self_attn.q_proj.weight", (4, 2), "float32"),
                     ("model.layers.0.self_attn.k_proj.weight", (2, 2), "float32"),
                     ("model.layers.0.self_attn.v_proj.weight", (2, 2), "float32")], "cpu")
        q, k, v = torch.randn(4, 2), torch.randn(2, 2), torch.randn(2, 2)
        names = ["model.layers.0.self_attn.%s_proj.weight" % x for x in "qkv"]
        spans = [(0, 32), (32, 48), (48, 64)]
        key = apply.layout_key([(n, "float32", tuple(t.shape), a, b)
                                for n, t, (a, b) in zip(names, (q, k, v), spans)])
        flat = torch.cat([t.reshape(-1) for t in (q, k, v)]).view(torch.uint8).share_memory_()
        apply.load_flat(m, ipc.loads(ipc.dumps([(key, flat)])))
        got = m.get_parameter("model.layers.0.self_attn.qkv_proj.weight")
        assert torch.equal(got, torch.cat([q, k, v])), "apply"
        assert verify.tensor_checksum(got, "device") == ck.device_checksum(torch.cat([q, k, v]))
        class Engine:
            tp_size, device = 1, "cpu"
            def accepts(self, fmt): return True
        c = Colocated(); c.open(Engine(), type("P", (), {"buckets": []})())
        assert c.fmt == apply.FORMAT
        torch.cuda.is_available = lambda: True  # the direct transport refuses a GPU before any SGLang import
        try:
            Direct(Mappings()).open(Engine(), None)
            raise AssertionError("not refused")
        except Unsupported:
            pass
        print("torch alone: ok")
    """)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0 and "torch alone: ok" in p.stdout, p.stderr[-3000:]
