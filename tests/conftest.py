import os

import pytest

# Ray and tqdm stay quiet and local in tests; a user's RAY_ADDRESS must not send CI work to their cluster.
# Tests run Ray as users do: loopback only, token auth on (labkit.cluster.runtime).
os.environ.pop("RAY_ADDRESS", None)
os.environ.setdefault("TQDM_MININTERVAL", "5")


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (NCCL/CUDA IPC/TE/speculative decoding cannot run on CPU)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
