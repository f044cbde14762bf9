"""A real SGLang 0.5.23 engine on CPU: in a Ray actor (session fixture `engine`) and over HTTP."""

import threading
import time

import pytest
import torch
from safetensors.torch import load_file

from labkit.compat import loopback
from labkit.engine import EngineConfig, EngineError, EngineHandle, EngineUnreachable, Unsupported
from labkit.models import tokenizer
from tests.integration.conftest import engine_config, live, shm_leftovers

pytestmark = pytest.mark.integration

PROMPTS = ["hello world", "1+2=", "The quick brown fox", "#include <stdio.h>"]
UPDATED = ["model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.up_proj.weight", "model.norm.weight"]
GREEDY = {"temperature": 0.0, "max_new_tokens": 12}


def _weights(model_dir):
    return load_file(str(model_dir / "model.safetensors"))


def _hf_greedy(model_dir, ids: list[int], n: int) -> tuple[list[int], float]:
    """transformers' greedy continuation (stops after EOS like SGLang) and its smallest top-1/top-2 logit gap."""
    from labkit.models.hf import ReferenceModel

    trunk = ReferenceModel(model_dir).trunk
    out = trunk.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, output_scores=True,
                         return_dict_in_generate=True, pad_token_id=tokenizer.PAD)
    new = out.sequences[0, len(ids):].tolist()
    if tokenizer.EOS in new:
        new = new[: new.index(tokenizer.EOS) + 1]
    gaps = [s[0].topk(2).values for s in out.scores[: len(new)]]
    return new, min((g[0] - g[1]).item() for g in gaps)


def _perturbed(weights, step: float) -> list[tuple[str, torch.Tensor]]:
    return [(n, weights[n] + step * torch.randn(weights[n].shape, generator=torch.Generator().manual_seed(i)))
            for i, n in enumerate(UPDATED)]


def _update_in_session(handle, named, version):
    handle.begin_weight_update()
    try:
        for i, (n, t) in enumerate(named):  # per-tensor updates, the version lands with the last one
            handle.update_weights_from_tensor([(n, t)], flush_cache=i == len(named) - 1,
                                              weight_version=version if i == len(named) - 1 else None)
    finally:
        handle.end_weight_update()


def _assert_weights(handle, named):
    for n, t in named:
        got = handle.get_weights_by_name(n)
        assert got.dtype == torch.float32 and got.shape == t.shape, n
        assert torch.equal(got, t), f"{n}: engine tensor differs from the one sent"


# --- cheap checks (no engine) ------------------------------------------------------------------------------
def test_config_validation_names_field_value_and_allowed():
    with pytest.raises(ValueError, match=r"EngineConfig\.dtype='fp8'.*auto, float32, bfloat16"):
        EngineConfig(model_dir="/x", dtype="fp8")
    with pytest.raises(ValueError, match=r"EngineConfig\.url='localhost:1'.*http"):
        EngineConfig(model_dir="/x", url="localhost:1")
    with pytest.raises(ValueError, match=r"EngineConfig\.mem_fraction_static=1\.5"):
        EngineConfig(model_dir="/x", mem_fraction_static=1.5)
    # SGLang would size a CPU KV cache from free RAM (14 GB for the tiny model): capped unless sized
    assert EngineConfig(model_dir="/x").sglang_kwargs("cpu")["max_total_tokens"] == 16384


def test_version_guard_and_cpu_tp_refusal(engine_model_dir):
    import os

    from labkit.compat import sglang as compat

    assert compat.check_sglang_version() == "0.5.23"
    with pytest.raises(RuntimeError, match=r"written for sglang 0\.5\.23, found sglang '0\.5\.22'"):
        compat.check_sglang_version("0.5.22")
    cores = len(os.sched_getaffinity(0))  # a CPU engine runs at most one rank per core (labkit.compat.cpu_tp)
    with pytest.raises(Unsupported, match=f"tp={cores + 1} is invalid on this CPU engine"):
        EngineHandle.start(engine_config(engine_model_dir, tp=cores + 1))


def test_bad_model_dir_fails_early_naming_it(tmp_path):
    with pytest.raises(EngineError, match="is not a directory"):
        EngineHandle.start(engine_config(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(EngineError, match=r"empty'.*no config\.json"):
        EngineHandle.start(engine_config(tmp_path / "empty"))


def test_dead_url_is_a_clear_bounded_error():
    from labkit.cluster.runtime import free_port

    url = f"http://127.0.0.1:{free_port()}"
    t = time.monotonic()
    with pytest.raises(EngineUnreachable, match=url):
        EngineHandle.start(EngineConfig(model_dir="/unused", url=url, call_timeout_s=5))
    assert time.monotonic() - t < 15


# --- the Ray-actor engine ----------------------------------------------------------------------------------
def test_engine_runs_fp32_on_cpu_with_the_compat_layer(engine):
    info = engine._b.ready()
    assert "SGLANG_USE_CPU_ENGINE=1" in info["compat"] and "sgl_kernel placeholder" in info["compat"]
    assert engine.health() and engine.weight_version == "default"


def test_greedy_generation_matches_transformers(engine, engine_model_dir):
    ids = [tokenizer.encode(p) for p in PROMPTS]
    outs = engine.generate(input_ids=ids, sampling=GREEDY)
    for p, i, o in zip(PROMPTS, ids, outs):
        ref, gap = _hf_greedy(engine_model_dir, i, GREEDY["max_new_tokens"])
        assert o["tokens"] == ref, f"{p!r}: SGLang {o['tokens']} != transformers {ref} (min top-2 gap {gap:.2e})"
        assert gap > 1e-4, f"{p!r}: greedy margin {gap:.1e} too small for a meaningful comparison"


def test_per_request_sampling_seeds_repeat_across_batches_and_differ_between_seeds(engine):
    """labkit.compat.seeded: SGLang's CPU engine ignores `sampling_seed` on its own (deterministic inference is
    refused there). With the compat layer a (prompt, seed) gives the same tokens in any batch order or company,
    other seeds give other samples, and unseeded requests still sample freshly."""
    ids = [tokenizer.encode(p) for p in PROMPTS[:2]] * 4  # the same two prompts four times each

    def params(seeds):
        return [{"temperature": 1.0, "max_new_tokens": 8, "sampling_seed": s} for s in seeds]

    seeds = [100, 101, 100, 103, 104, 105, 106, 107]  # requests 0 and 2: same prompt, same seed
    a = [o["tokens"] for o in engine.generate(input_ids=ids, sampling=params(seeds))]
    b = [o["tokens"] for o in engine.generate(input_ids=ids[::-1], sampling=params(seeds[::-1]))][::-1]
    assert a == b and a[0] == a[2]
    assert len({tuple(t) for t in a}) >= 4  # a random-init model at T=1: distinct seeds sample distinct answers
    c = [o["tokens"] for o in engine.generate(input_ids=ids, sampling=params([s + 1000 for s in seeds]))]
    assert c != a
    free = {"temperature": 1.0, "max_new_tokens": 8}
    u1, u2 = ([o["tokens"] for o in engine.generate(input_ids=ids, sampling=free)] for _ in range(2))
    assert u1 != u2


def test_prompts_give_text_logprobs_and_meta_info(engine):
    outs = engine.generate(prompts=PROMPTS[:2], sampling=GREEDY, return_logprob=True)
    by_ids = engine.generate(input_ids=[tokenizer.encode(p) for p in PROMPTS[:2]], sampling=GREEDY)
    for o, b in zip(outs, by_ids):
        assert o["tokens"] == b["tokens"]  # the model dir's tokenizer adds nothing to the prompt
        assert o["text"] == tokenizer.decode(o["tokens"])
        assert len(o["logprobs"]) == len(o["tokens"]) and all(lp <= 0 for lp in o["logprobs"])
        assert o["meta_info"]["weight_version"] == "default" and "output_token_logprobs" not in o["meta_info"]
    assert by_ids[0]["logprobs"] is None


def test_update_inside_session_is_bitwise_and_versioned(engine, engine_model_dir):
    weights = _weights(engine_model_dir)
    before = engine.generate(input_ids=[tokenizer.encode(PROMPTS[0])], sampling=GREEDY)[0]
    new = _perturbed(weights, 0.5)
    try:
        _update_in_session(engine, new, "step-1")
        _assert_weights(engine, new)
        assert engine.weight_version == "step-1"
        after = engine.generate(input_ids=[tokenizer.encode(PROMPTS[0])], sampling=GREEDY)[0]
        assert after["meta_info"]["weight_version"] == "step-1"
        assert after["tokens"] != before["tokens"], "new weights must change the greedy continuation"
    finally:  # other tests share this engine: put the original weights back
        _update_in_session(engine, [(n, weights[n]) for n in UPDATED], "default")
    _assert_weights(engine, [(n, weights[n]) for n in UPDATED])
    assert engine.generate(input_ids=[tokenizer.encode(PROMPTS[0])], sampling=GREEDY)[0]["tokens"] == before["tokens"]


def test_update_outside_session_is_refused_and_weights_stay(engine, engine_model_dir):
    weights = _weights(engine_model_dir)
    version = engine.weight_version
    with pytest.raises(EngineError, match="must run between begin_weight_update"):
        engine.update_weights_from_tensor(_perturbed(weights, 1.0)[:1], weight_version="rogue")
    _assert_weights(engine, [(n, weights[n]) for n in UPDATED])
    assert engine.weight_version == version


def _trainer_group(port: int, group: str):
    """The trainer side of SGLang's weight-update group, made as sglang's init_custom_process_group makes it
    (rendezvous, PrefixStore(group), _new_process_group_helper): rank 0 of 2, the engine is rank 1."""
    from datetime import timedelta

    from torch.distributed import distributed_c10d as c10d

    store, _, _ = next(c10d.rendezvous(f"tcp://127.0.0.1:{port}", 0, 2, timeout=timedelta(seconds=60)))
    pg, _ = c10d._new_process_group_helper(2, 0, [], c10d.Backend("gloo"), c10d.PrefixStore(group, store),
                                           group_name=group, timeout=timedelta(seconds=60))
    c10d._world.pg_group_ranks[pg] = {0: 0, 1: 1}
    return pg


def _beside(fn, *args):
    """Run fn in a thread while the engine call (which waits for the peer) runs here; bounded join."""
    import threading

    box = {}

    def target():
        try:
            box["out"] = fn(*args)
        except BaseException as e:  # re-raised in the joining thread, where pytest sees it
            box["err"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()

    def join():
        t.join(60)
        if "err" in box:
            raise box["err"]
        if t.is_alive():
            raise TimeoutError(f"{getattr(fn, '__name__', fn)} still running after 60 s")
        return box["out"]
    return join


def test_update_from_distributed_over_gloo(engine, engine_model_dir):
    import torch.distributed as dist

    from labkit.cluster.runtime import free_port

    weights, port, group = _weights(engine_model_dir), free_port(), "labkit_test_wu"
    join = _beside(_trainer_group, port, group)
    engine.init_weights_update_group("127.0.0.1", port, rank_offset=1, world_size=2, group_name=group)
    pg = join()
    try:
        for named, version in ((_perturbed(weights, 0.125), "dist-1"), ([(n, weights[n]) for n in UPDATED], "default")):
            engine.begin_weight_update()
            join = _beside(lambda: [dist.broadcast(t, src=0, group=pg) for _, t in named])
            engine.update_weights_from_distributed([n for n, _ in named], ["float32"] * len(named),
                                                   [list(t.shape) for _, t in named], group_name=group,
                                                   weight_version=version)
            join()
            engine.end_weight_update()
            _assert_weights(engine, named)
            assert engine.weight_version == version
    finally:
        engine.destroy_weights_update_group(group)
        dist.destroy_process_group(pg)


def _sglang_checksum(t: torch.Tensor) -> str:
    """SGLang's weight checker with labkit's models: xxh3-64 of the raw bytes (labkit.engine.checksum), computed
    here independently of labkit's code."""
    import xxhash

    raw = memoryview(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy())
    return "xxh3:" + xxhash.xxh3_64(raw).hexdigest()


def test_checksums_and_a_portable_handle_in_another_process(engine, engine_model_dir):
    import pickle

    import ray

    w, p = _weights(engine_model_dir), "model.layers.0"
    sums = engine.checksums()
    assert sums["model.norm.weight"] == _sglang_checksum(w["model.norm.weight"])
    qkv = torch.cat([w[f"{p}.self_attn.{x}_proj.weight"] for x in "qkv"])  # the engine's fused layout
    assert sums[f"{p}.self_attn.qkv_proj.weight"] == _sglang_checksum(qkv)

    portable = pickle.loads(pickle.dumps(engine.portable()))
    assert ray.get(ray.remote(lambda h: (h.tp_size, h.weight_version)).remote(portable), timeout=60) == (1, "default")
    assert portable.shutdown() == [] and engine.health()  # it owns nothing


def test_cpu_memory_release_is_refused_without_asking_sglang(engine):
    for call in (engine.release_memory, engine.resume_memory):
        with pytest.raises(Unsupported, match="NVIDIA driver"):
            call()
    assert engine.health()


def test_flush_pause_continue_and_unknown_tensor(engine):
    engine.flush_cache()
    engine.pause_generation()
    # Another process's handle: the actor refuses while paused; the handle holds the request for its call
    # timeout, then raises naming why (an engine left paused by a failed restore must not hang callers).
    with pytest.raises(EngineError, match=r"paused.*held 1 s"):
        engine.portable(call_timeout_s=1).generate(input_ids=[[5, 6, 7]], sampling=GREEDY)
    held = {}
    t = threading.Thread(target=lambda: held.update(out=engine.generate(input_ids=[[5, 6, 7]], sampling=GREEDY)))
    t.start()
    time.sleep(1.0)
    assert t.is_alive() and not held  # waiting for the update to end, not failing
    engine.continue_generation()
    t.join(timeout=60)
    assert held["out"][0]["tokens"]  # answered once generation continued
    engine.set_weight_version("manual-1")
    assert engine.generate(input_ids=[[5, 6, 7]], sampling=GREEDY)[0]["meta_info"]["weight_version"] == "manual-1"
    engine.set_weight_version("default")
    with pytest.raises(EngineError, match="no_such.weight"):
        engine.get_weights_by_name("no_such.weight")


def test_sglang_load_failure_is_surfaced_naming_the_dir(engine_model_dir, tmp_path):
    import shutil

    bad = tmp_path / "corrupt"
    shutil.copytree(engine_model_dir, bad)
    (bad / "model.safetensors").write_bytes(b"not a safetensors file")
    t = time.monotonic()
    with pytest.raises(EngineError, match="corrupt") as err:
        EngineHandle.start(engine_config(bad, start_timeout_s=150))
    assert time.monotonic() - t < 150, "a failing load must not wait for the start timeout"
    print(f"load failure surfaced in {time.monotonic() - t:.1f} s: {err.value}")


# --- the HTTP server -------------------------------------------------------------------------------------
def _openai_endpoints_answer_the_greedy_text(url: str, want: str) -> None:
    """What an OpenAI client sees: /v1/completions and /v1/chat/completions answer PROMPTS[1]'s greedy text (the
    chat request through the models' shipped chat template, labkit.models.tokenizer.CHAT_TEMPLATE)."""
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", timeout=60, max_retries=0)
    greedy = {"max_tokens": GREEDY["max_new_tokens"], "temperature": 0.0}
    comp = client.completions.create(model="tiny", prompt=PROMPTS[1], **greedy)
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPTS[1]}], **greedy)
    assert want and comp.choices[0].text == chat.choices[0].message.content == want, (want, comp, chat)


def test_http_server_generate_update_verify_shutdown(engine, engine_model_dir):
    import psutil

    weights = _weights(engine_model_dir)
    handle = EngineHandle.launch(engine_config(engine_model_dir))
    tree = [handle._server.proc.pid, *(p.pid for p in psutil.Process(handle._server.proc.pid).children(True))]
    try:
        assert handle.health() and EngineHandle.connect(handle.url).health()
        # The server, its scheduler (TP store) and detokenizer listen on loopback only.
        found = loopback.listeners(handle._server.proc.pid)
        assert found and not loopback.exposed(found), found
        ids = [tokenizer.encode(p) for p in PROMPTS[:2]]
        http_out = handle.generate(input_ids=ids, sampling=GREEDY, return_logprob=True)
        ray_out = engine.generate(input_ids=ids, sampling=GREEDY)
        assert [o["tokens"] for o in http_out] == [o["tokens"] for o in ray_out]
        assert len(http_out[0]["logprobs"]) == len(http_out[0]["tokens"])
        _openai_endpoints_answer_the_greedy_text(handle.url, tokenizer.decode(ray_out[1]["tokens"]))

        with pytest.raises(EngineError, match="must run between begin_weight_update"):
            handle.update_weights_from_tensor(_perturbed(weights, 1.0)[:1])
        _assert_weights(handle, [(n, weights[n]) for n in UPDATED])

        new = _perturbed(weights, 0.25)
        _update_in_session(handle, new, "http-1")
        _assert_weights(handle, new)
        assert handle.weight_version == "http-1"
        assert handle.generate(input_ids=ids[:1], sampling=GREEDY)[0]["meta_info"]["weight_version"] == "http-1"
    finally:
        handle.shutdown()
    assert not live(tree), f"server shutdown left processes {live(tree)}"
    assert not shm_leftovers(tree), f"server shutdown left {shm_leftovers(tree)}"
    with pytest.raises(EngineUnreachable, match=handle.url):
        EngineHandle.connect(handle.url, EngineConfig(model_dir="/unused", url=handle.url, call_timeout_s=3))
