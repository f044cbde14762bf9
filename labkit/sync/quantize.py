"""Quantize on the way: a bf16 (or fp32) trainer syncing into a block-FP8 engine.

The engine's checkpoint decides what is fp8 (labkit.models.fp8: quantizable weights, each with a `weight_scale_inv`),
and the sync follows it: every exported weight the engine holds in float8_e4m3fn is quantized here, on the trainer's
side, by labkit's one recipe, and its scale is yielded right after it, so the planner puts both in one group and one
bucket (labkit.engine.contract.plan_group): the engine never serves a new weight with an old scale. Everything else
passes unchanged (the planner casts it to the engine's dtype).

Quantizing here rather than in the engine keeps verification bitwise: the trainer hashes exactly the bytes it sent, and
the engine hashes the fp8 weights and scales it holds (not a dequantization, which two different weight/scale pairs can
share). A tensor that arrives already in fp8 passes as it is (a producer that quantized it); a float tensor for an fp8
slot without a scale in the engine's model is left for the contract check to refuse by name, never cast.
"""

from __future__ import annotations

import time

from labkit.models import fp8

E4M3 = fp8.E4M3


def on_the_way(named, tensors: dict, recipe: dict, phases: dict | None = None):
    """(name, tensor) pairs with every weight the engine holds in fp8 replaced by (name, q), (scale name, s).
    `tensors`: the engine's {name: (shape, dtype)}; `recipe`: its block-FP8 recipe (labkit.models.fp8.recipe_of).
    `phases`: a sync's phase timings, credited with `quantize` (and debited the same from `gather`, whose timer
    wraps the pull from this generator)."""
    for name, t in named:
        want = tensors.get(name)
        scale = name + fp8.SCALE_SUFFIX
        if want is None or want[1] != E4M3 or scale not in tensors or str(t.dtype) == f"torch.{E4M3}" \
                or not t.is_floating_point():
            yield name, t
            continue
        t0 = time.perf_counter()
        q, s = fp8.quantize(t, recipe["block"], recipe["pow2_scales"])
        if phases is not None:
            dt = time.perf_counter() - t0
            phases["quantize"] = phases.get("quantize", 0.0) + dt
            phases["gather"] = phases.get("gather", 0.0) - dt
        yield name, q
        yield scale, s
