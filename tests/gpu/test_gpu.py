"""GPU checks (NCCL, bf16, CUDA IPC). Skipped on CPU machines with the reason; run with `pytest -m gpu`."""

import pytest
import torch

from labkit.config import ModelSpec, ParallelSpec, TrainConfig

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from labkit.models.tiny import make_tiny_mimo

    return make_tiny_mimo(tmp_path_factory.mktemp("gpu") / "tiny", ModelSpec(hidden=256, layers=4, heads=4,
                                                                            kv_heads=2, ffn=768))


def test_megatron_on_cuda_matches_transformers_in_bf16(model_dir):
    """TP=1 over NCCL, bf16 params: logits within bf16 tolerance of the fp32 transformers reference."""
    from labkit.models.hf import ReferenceModel
    from labkit.trainer.group import Trainer

    tr = Trainer(str(model_dir), ParallelSpec(), TrainConfig())
    try:
        assert tr.compat == []  # no CPU shims on a GPU machine
        tokens = torch.randint(4, 100, (2, 32))
        mine = tr.forward(tokens)["logits"].float().cpu()
        ref = ReferenceModel(model_dir).forward(tokens)["logits"]
        diff = (mine[..., : ref.shape[-1]] - ref).abs().max().item()
        assert diff <= 5e-2, f"bf16 logits differ by {diff}"  # bf16 has ~3 significant digits
    finally:
        tr.shutdown()


def test_colocated_cuda_ipc_sync_verifies(model_dir):
    from labkit.sync import SyncConfig
    from labkit.workbench import Workbench

    with Workbench(str(model_dir)) as wb:
        wb.train(2)
        m = wb.sync(SyncConfig(transport="colocated", bucket_mb=8))
        assert m["sync/verified"] is True
        m = wb.sync(SyncConfig(transport="distributed", bucket_mb=8))
        assert m["sync/verified"] is True
