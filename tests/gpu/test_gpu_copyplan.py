"""labkit.engine.inside.copyplan's merged strided copies on a CUDA device: an MoE bucket (padded and not, bf16) lands in
the parameters bitwise, as one copy per tensor lands it. Needs torch with CUDA only
(`pytest -m gpu tests/gpu/test_gpu_copyplan.py`); `scripts/copyruns_bench.py` times the two on the device."""

import pytest
import torch

from tests.unit.test_copyruns import Experts, _apply, _bucket, _moe_names

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the merged copies run on CPU in tests/unit/test_copyruns.py")


@pytest.mark.parametrize("pad", [0, 3])
def test_merged_copies_on_cuda_land_bitwise(pad):
    m = Experts(9, 7, 16, pad, torch.bfloat16, "cuda")
    ref = Experts(9, 7, 16, pad, torch.bfloat16, "cuda")
    names = ["norm", "q", "k", "v"] + _moe_names(range(2, 9))
    key, flat, named = _bucket(m, names)
    assert flat.is_cuda
    plan = _apply(m, key, flat)
    for n, t in named.items():
        ref.param_view(n)[1].copy_(t)
    torch.cuda.synchronize()
    assert len(plan.runs) < len(names) // 3
    assert all(torch.equal(a, b) for a, b in zip(m.parameters(), ref.parameters()))


def test_large_pieces_stay_one_copy_each_on_cuda():
    """On a GPU the multi-tensor copy is faster for large pieces (copyplan.GPU_MERGE_BELOW): those are not merged."""
    from labkit.engine.inside import copyplan

    m = Experts(3, 256, 1024, 0, torch.bfloat16, "cuda")  # gate+up = 1 MiB per expert, down 0.5 MiB
    key, flat, named = _bucket(m, _moe_names(range(3)))
    plan = _apply(m, key, flat)
    torch.cuda.synchronize()
    assert 2 * 256 * 1024 * 2 >= copyplan.GPU_MERGE_BELOW
    assert len(plan.runs) == 3 + 1  # three gate/up pairs one copy each (6 tensors), the downs merged
    assert all(torch.equal(m.param_view(n)[1], t) for n, t in named.items())
