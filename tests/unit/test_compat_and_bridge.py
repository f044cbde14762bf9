import pytest
import torch

from labkit.compat.megatron import SUPPORTED_MEGATRON, check_megatron_version
from labkit.trainer.bridge import swap_halves


def test_unknown_megatron_version_is_refused_naming_it():
    check_megatron_version(SUPPORTED_MEGATRON[0])
    with pytest.raises(RuntimeError, match="'0.99.0'"):
        check_megatron_version("0.99.0")


def test_swap_halves_is_its_own_inverse_and_matches_mimo_order():
    h = 3
    w = torch.randn(h, 2 * h)
    emb, hid = torch.randn(h), torch.randn(h)
    # Megatron computes eh_proj(cat[emb, hid]); MiMo computes input_proj(cat[hid, emb]).
    assert torch.allclose(w @ torch.cat([emb, hid]), swap_halves(w) @ torch.cat([hid, emb]))
    assert torch.equal(swap_halves(swap_halves(w)), w)


def test_doctor_reports_required_keys():
    from labkit import doctor

    r = doctor.report()
    for k in ("torch", "megatron_core", "mbridge", "transformers", "sglang", "ray", "cuda_available", "compat"):
        assert k in r
    assert r["cuda_available"] == torch.cuda.is_available()
    assert (r["compat"] == []) == torch.cuda.is_available()
