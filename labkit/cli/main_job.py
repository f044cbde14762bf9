"""`labkit doctor`, `labkit demo`, `labkit sync`: the main job (train, sync into a real SGLang engine, verify,
compare greedy) and the check of the box it runs on. Flags come from the configs' fields."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from labkit.cli.output import Output, add_model_arguments, emit, model_of, write_run
from labkit.cluster.placement import PlacementSpec
from labkit.config import ParallelSpec, add_arguments, check
from labkit.engine.config import EngineConfig
from labkit.sync.config import SyncConfig


@dataclass(kw_only=True, slots=True, frozen=True)
class JobConfig:
    """`labkit demo` and `labkit sync`: the run around the sync (how long it trains, where the demo writes)."""

    steps: int = 10
    """Training steps before the syncs."""
    model: str | None = None
    """HF model directory; None: the shipped tiny MiMo (data/tiny-mimo)."""
    workdir: str = "runs/demo"
    """Folder the demo writes its exported checkpoint to."""

    def __post_init__(self) -> None:
        check(isinstance(self.steps, int) and not isinstance(self.steps, bool) and self.steps >= 0, "steps",
              self.steps, "an integer >= 0")
        check(self.model is None or (isinstance(self.model, str) and self.model.strip() != ""), "model", self.model,
              "None or a non-empty path")
        check(isinstance(self.workdir, str) and self.workdir.strip() != "", "workdir", self.workdir, "a non-empty path")


SYNC_JOB = JobConfig(steps=3)  # `labkit sync`: a few steps, so the sync moves changed weights


def cmd_doctor(args) -> int:
    from labkit import doctor

    r = doctor.report()
    if not args.json:
        print(doctor.format_text(r))
    else:
        emit(r, True)
    return 0


def cmd_demo(args) -> int:
    from labkit.workbench import demo

    m = demo.run(workdir=args.workdir, steps=args.steps, tp=args.tp, pp=args.pp, model_dir=args.model)
    code, failed = demo.verdict(m)
    m["demo/failed_checks"] = failed
    emit(m, args.json)
    for f in failed:  # a demo whose checks fail must not look like a passing one (exit 0)
        print(f"labkit demo: check failed: {f}", file=sys.stderr)
    print(demo.summary(m, failed), file=sys.stderr if args.json else sys.stdout)
    return code


def placement_of(args) -> PlacementSpec:
    """`labkit sync`'s placement flags, as the PlacementSpec a Workbench is placed by (validated on construction)."""
    return PlacementSpec(mode=args.placement, trainer_resource=args.trainer_resource,
                         engine_resource=args.engine_resource, engines=args.engines)


def cmd_sync(args) -> int:
    from labkit.sync.atomic import SyncFailed
    from labkit.workbench import Workbench
    from labkit.workbench.core import default_engine

    # Validate every flag before anything starts.
    cfg = SyncConfig(transport=args.transport, bucket_mb=args.bucket_mb, memory_budget_mb=args.memory_budget_mb,
                     verify=args.verify, probe=args.probe, probe_kl_max=args.probe_kl_max, progress=not args.json)
    parallel = ParallelSpec(tp=args.tp, pp=args.pp, ep=args.ep)
    where = placement_of(args)
    engine = default_engine(model_of(args), tp=args.engine_tp, **({"dtype": args.engine_dtype} if args.engine_dtype
                                                                  else {}))
    with Workbench(model_of(args), parallel, engine_cfg=engine, engine_url=args.engine_url, placement=where) as wb:
        wb.train(args.steps, progress=not args.json)
        try:
            m = wb.sync(cfg)
        except SyncFailed as e:  # the engine serves its last good weights (or says why not): say it, no traceback
            print(f"labkit sync: {e}", file=sys.stderr)
            emit(e.metrics, args.json)
            write_run(e.metrics, args.out)
            return 1
        g = wb.compare_greedy()
    m.update(g.metrics)
    emit(m, args.json)
    write_run(m, args.out)
    return 0 if m["sync/verified"] is not False else 1


def add_commands(sub) -> None:
    """doctor, demo, sync: the main job and its parts."""
    d = sub.add_parser("doctor", help="versions, devices and active compat layers")
    add_arguments(d, Output, ("json",))
    d.set_defaults(fn=cmd_doctor)

    d = sub.add_parser("demo", help="the main job on the embedded default")
    add_arguments(d, JobConfig, ("workdir", "model", "steps"))
    add_arguments(d, ParallelSpec, ("tp", "pp"))
    add_arguments(d, Output, ("json",))
    d.set_defaults(fn=cmd_demo)

    d = sub.add_parser("sync", help="train a few steps, sync into a real SGLang engine, verify, compare greedy")
    add_arguments(d, SyncConfig, ("transport", "bucket_mb", "memory_budget_mb", "verify", "probe", "probe_kl_max"))
    add_model_arguments(d, "data/tiny-mimo")
    add_arguments(d, EngineConfig, ("url", "tp"), base=EngineConfig(model_dir="data/tiny-mimo"),
                  flags={"url": "--engine-url", "tp": "--engine-tp"})
    add_arguments(d, EngineConfig, ("dtype",), base=EngineConfig(model_dir="data/tiny-mimo", dtype="float32"),
                  flags={"dtype": "--engine-dtype"}, keep=True,
                  notes={"dtype": "Unset: float32, or bfloat16 for a block-FP8 checkpoint (an -fp8 preset)."})
    add_arguments(d, JobConfig, ("steps",), base=SYNC_JOB)
    add_arguments(d, ParallelSpec, ("tp", "pp", "ep"))
    add_arguments(d, PlacementSpec, ("mode", "trainer_resource", "engine_resource", "engines"),
                  flags={"mode": "--placement"})
    add_arguments(d, Output, ("out", "json"))
    d.set_defaults(fn=cmd_sync)
