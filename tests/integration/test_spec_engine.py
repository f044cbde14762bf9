"""SGLang's own speculative decoding on the CPU engine (labkit.compat.spec_cpu): the shipped tiny MiMo with its MTP
layer as the draft, SGLang's EAGLE worker at 2 steps. The target's output is unchanged; the engine's counters equal
labkit's loop on SGLang's draft inputs; a sync reaches the draft runner and is verified on it, and the draft the
engine then runs is the one synced; at T = 1 the verified tokens are distributed as the target's."""

import pytest
import torch
from safetensors.torch import load_file
from scipy.stats import chisquare

from labkit.engine import Unsupported
from labkit.engine.config import SpeculativeConfig
from labkit.models.tiny import default_model_dir
from labkit.mtp.engine_accept import cross_check, engine_acceptance
from labkit.mtp.experiment import evaluation_set
from labkit.sync import SyncConfig, stream
from labkit.tasks import ArithTask
from tests.integration.conftest import started_engine

pytestmark = pytest.mark.integration
K = 2
MTP = "model.mtp_layers.0."


@pytest.fixture(scope="module")
def spec_engine():
    with started_engine(default_model_dir(), max_total_tokens=8192,
                        speculative=SpeculativeConfig(num_steps=K, num_draft_tokens=K + 1)) as handle:
        yield handle


@pytest.fixture(scope="module")
def held_out():
    task = ArithTask()
    return [task.tokenizer.encode(p.prompt) for p in evaluation_set(task, 48)[0]]


def _weights():
    return load_file(f"{default_model_dir()}/model.safetensors")


def test_greedy_counters_equal_labkits_loop_and_the_output_is_the_targets(spec_engine, held_out):
    from labkit.mtp.speculative import Speculator

    named = _weights()
    outs = spec_engine.generate(input_ids=held_out, sampling={"temperature": 0, "max_new_tokens": 16})
    target = Speculator(default_model_dir(), named).target_generate(held_out, 0.0, 16)
    assert [o["tokens"] for o in outs] == [r["output_ids"] for r in target["requests"]]
    m = cross_check(spec_engine, default_model_dir(), named, None, held_out, K, 16)
    assert m["mtp/engine_greedy_accept_rate"] > 0.2  # the pretrained draft is accepted: a comparison with content
    assert all(m[f"mtp/engine_vs_loop_accept_diff{s}"] <= 0.01 for s in ("", "_pos_1", "_pos_2")), m
    again = engine_acceptance(spec_engine, held_out, K, 1.0, 16, seed=5)
    assert again == engine_acceptance(spec_engine, held_out, K, 1.0, 16, seed=5)  # seeded: repeatable


@pytest.mark.parametrize("transport", ["colocated", "per-tensor"])
def test_a_sync_lands_in_the_draft_runner_verified_and_the_engine_drafts_with_it(spec_engine, held_out, transport):
    named = _weights()
    before = engine_acceptance(spec_engine, held_out, K, 0.0, 16, seed=0)
    g = torch.Generator().manual_seed(1)
    noisy = {n: (t + 0.5 * torch.randn(t.shape, generator=g) if n.startswith(MTP) and t.dim() == 2 else t)
             for n, t in named.items()}
    try:
        m = stream(noisy.items(), spec_engine, SyncConfig(transport=transport, progress=False))
        assert m["sync/verified"] and m["verify/draft_checked"] >= 10 and not m["verify/draft_unchecked"]
        worse = engine_acceptance(spec_engine, held_out, K, 0.0, 16, seed=0)
        assert worse["mtp/accept_rate"] < before["mtp/accept_rate"] - 0.1  # the engine drafts with the synced layer
    finally:
        m = stream(named.items(), spec_engine, SyncConfig(transport=transport, progress=False),
                   weight_version="default")
    assert m["sync/verified"]
    assert engine_acceptance(spec_engine, held_out, K, 0.0, 16, seed=0) == before  # restored: counters bitwise


def test_a_batch_mixing_greedy_top_k_and_top_p_requests_is_served(spec_engine, held_out):
    """SGLang runs a greedy request in a sampled batch as top-k 1, and renormalizes the verify step's probabilities
    by top-k / top-p: FlashInfer's on GPU, labkit's on CPU (SGLang's are None there)."""
    from labkit.mtp.speculative import Speculator

    prompts = held_out[:3]
    outs = spec_engine.generate(input_ids=prompts, sampling=[
        {"temperature": 0.0, "max_new_tokens": 8}, {"temperature": 1.0, "top_k": 5, "max_new_tokens": 8},
        {"temperature": 0.8, "top_p": 0.9, "max_new_tokens": 8}])
    greedy = Speculator(default_model_dir(), _weights()).target_generate(prompts[:1], 0.0, 8)["requests"][0]
    assert outs[0]["tokens"] == greedy["output_ids"] and all(o["tokens"] for o in outs[1:])


def test_direct_is_refused_into_an_engine_with_a_draft_runner(spec_engine):
    with pytest.raises(Unsupported, match="draft runner"):
        stream(_weights().items(), spec_engine, SyncConfig(transport="direct", progress=False))


def _target_probs(prompt: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(p(t1), p(t2) = sum over t1 of p(t1) p(t2 | t1)) from the target's own forward (labkit's HF reference)."""
    from labkit.models.hf import ReferenceModel

    ref = ReferenceModel(default_model_dir())
    with torch.no_grad():
        p1 = torch.softmax(ref.trunk_forward(torch.tensor([prompt]))[0][0, -1].double(), -1)
        both = torch.cat([torch.tensor([prompt]).expand(p1.numel(), -1), torch.arange(p1.numel())[:, None]], 1)
        p2 = torch.softmax(ref.trunk_forward(both)[0][:, -1].double(), -1)
    return p1, p1 @ p2


def _p_value(tokens: list[int], p: torch.Tensor) -> float:
    seen = torch.bincount(torch.tensor(tokens), minlength=p.numel()).double()
    big = p * len(tokens) >= 5  # chi-square wants >= 5 expected per bin: the rest pooled
    obs = torch.cat([seen[big], seen[~big].sum()[None]])
    exp = torch.cat([p[big], p[~big].sum()[None]]) * len(tokens)
    return float(chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


def test_at_temperature_1_verified_tokens_are_distributed_as_the_targets(spec_engine, held_out):
    """The second token is the first a verify step emits. SGLang's CPU lane verifies greedily at any temperature;
    draws by that rule (the control, from the same target probabilities) fail the same test."""
    prompt, n = held_out[0], 600
    outs = spec_engine.generate(input_ids=[prompt] * n, sampling=[
        {"temperature": 1.0, "max_new_tokens": 2, "ignore_eos": True, "sampling_seed": 1000 + i} for i in range(n)])
    assert sum(o["meta_info"].get("spec_verify_ct", 0) for o in outs) == n  # each second token from a verify step
    p1, p2 = _target_probs(prompt)
    assert _p_value([o["tokens"][1] for o in outs], p2) > 1e-3
    g = torch.Generator().manual_seed(0)
    first = torch.multinomial(p1.float(), n, replacement=True, generator=g)
    from labkit.models.hf import ReferenceModel

    with torch.no_grad():
        logits = ReferenceModel(default_model_dir()).trunk_forward(
            torch.cat([torch.tensor([prompt]).expand(n, -1), first[:, None]], 1))[0][:, -1]
    assert _p_value(logits.argmax(-1).tolist(), p2) < 1e-6  # greedy verification: caught
