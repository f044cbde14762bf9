"""`labkit bench`, `tune`, `roofline`, `report`, `pretrain`: the lab's measurements, the README's tables and the
shipped checkpoint (the experiments, `faults` and `mtp-experiment`, are labkit.cli.experiments). Flags come from
the configs' fields; the small configs below hold the flags no library config holds."""

from __future__ import annotations

import argparse
from pathlib import Path
from dataclasses import dataclass
from typing import Literal

from labkit.cli.output import Output, add_model_arguments, command, emit, model_of, write_run
from labkit.config import add_arguments, check, check_choice, choices, field_docs
from labkit.lab.bench.serve import MODES, ServeBenchConfig
from labkit.sync.config import SyncConfig

Bench = Literal["sync", "serve-sync", "delta", "codec", "device"]
ROOFLINE_SCENARIO = ("model", "weights", "hardware", "bucket_mb")
ROOFLINE_LAYOUT = ("trainer_gpus", "engine_gpus", "engine_tp", "colocated_copy", "broadcast_nics")


def _positive(obj, *names: str) -> None:
    for f in names:
        v = getattr(obj, f)
        check(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0, f, v, "a positive number")


def _count(obj, name: str, lo: int) -> None:
    v = getattr(obj, name)
    check(isinstance(v, int) and not isinstance(v, bool) and v >= lo, name, v, f"an integer >= {lo}")


def _flag(obj, name: str) -> None:
    check(isinstance(getattr(obj, name), bool), name, getattr(obj, name), "True or False")


@dataclass(kw_only=True, slots=True, frozen=True)
class BenchConfig:
    """`labkit bench WHAT`: which benchmark, and its knobs (each help names the benchmarks it applies to)."""

    what: Bench = "sync"
    """sync: per-tensor vs bucketed vs memcpy; serve-sync: syncs under generate traffic, per pause mode; delta: full
    vs delta syncs into a bf16 engine; codec: the delta codec and the pack alone, on a GPU if any; device: the
    colocated data path stage by stage, torch alone."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """codec, device: where it runs."""
    size: Literal["auto", "small", "full"] = "auto"
    """device: full (two ~16 GB models; auto on a GPU) or small (auto on CPU)."""
    deadline: float = 330.0
    """device: seconds for the whole run; stages that would not fit are skipped and said so."""
    warm: int = 5
    """device: warm syncs per model after the cold one."""
    megatron: Literal["auto", "on", "off"] = "auto"
    """device: stage 5, labkit's Megatron trainer rank without Ray (auto: on a GPU)."""
    modes: str | None = None
    """serve-sync: comma-separated pause modes."""
    bucket_mb: float | None = None
    """Bucket size in MiB; None: 32 (device: 512 on a GPU, 1 on CPU, the held-out size half of it)."""
    reps: int = 3
    """Repetitions: timed syncs per transport (sync, delta), timed runs per case (codec)."""
    quick: bool = False
    """A small model (tests)."""
    engine_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """sync: the engine's dtype (auto: float32, bf16 for block FP8; bfloat16: the FP8 bench's bf16 counterpart)."""

    def __post_init__(self) -> None:
        for f in ("what", "device", "size", "megatron", "engine_dtype"):
            check_choice(self, f)
        _positive(self, "deadline", *(("bucket_mb",) if self.bucket_mb is not None else ()))
        _count(self, "warm", 1)
        _count(self, "reps", 1)
        _flag(self, "quick")
        check(self.modes is None or all(m in MODES for m in self.mode_list()), "modes", self.modes,
              f"comma-separated pause modes of {', '.join(MODES)}")

    def mode_list(self) -> tuple[str, ...] | None:
        return None if self.modes is None else tuple(m.strip() for m in self.modes.split(","))


@dataclass(kw_only=True, slots=True, frozen=True)
class TuneConfig:
    """`labkit tune`: the bucket sizes swept (log-spaced, two in flight under the budget) and the autotuner."""

    lo_mb: float = 0.5
    """Smallest bucket size tried, MiB."""
    hi_mb: float = 256.0
    """Largest bucket size tried, MiB."""
    memory_budget_mb: float = 512.0
    """Extra memory a sync may hold, MiB: sizes whose two buckets in flight exceed it are not tried."""
    max_trials: int = 6
    """The autotuner's trials at most (the sweep tries every size)."""
    quick: bool = False
    """A small model (tests)."""

    def __post_init__(self) -> None:
        _positive(self, "lo_mb", "hi_mb", "memory_budget_mb")
        _count(self, "max_trials", 1)
        _flag(self, "quick")
        # Named as a range, not a field: a flag checked alone against the other's default must not trip it.
        check(self.lo_mb <= self.hi_mb, "the range lo_mb..hi_mb", (self.lo_mb, self.hi_mb), "lo_mb <= hi_mb")


@dataclass(kw_only=True, slots=True, frozen=True)
class ReportConfig:
    """`labkit report`: rebuild the README's tables from the stored runs, or check them."""

    check: bool = False
    """Change nothing; exit 1 if a table is stale."""

    def __post_init__(self) -> None:
        _flag(self, "check")


@dataclass(kw_only=True, slots=True, frozen=True)
class PretrainConfig:
    """`labkit pretrain`: rebuild a shipped tiny MiMo checkpoint (labkit.lab.pretrain.pretrain)."""

    task: Literal["arith", "chain"] = "arith"
    """The task whose checkpoint to build: arith (data/tiny-mimo) or chain, the long-answer task
    (data/tiny-mimo-chain); its recipe (labkit.lab.pretrain.RECIPES) fills the flags left out."""
    out: str | None = None
    """Checkpoint directory to write; None: the task's shipped directory."""
    steps: int | None = None
    """Steps of the first stage: trunk and MTP head together; None: the task's recipe."""
    noise: float | None = None
    """Probability an answer digit (chain: a term) in the corpus is wrong; None: the task's recipe."""
    post_steps: int | None = None
    """Trunk-only post-training steps (the draft goes stale); None: the task's recipe."""

    def __post_init__(self) -> None:
        check(self.task in ("arith", "chain"), "task", self.task, "arith or chain")
        check(self.out is None or (isinstance(self.out, str) and self.out.strip() != ""), "out", self.out,
              "None or a non-empty path")
        if self.steps is not None:
            _count(self, "steps", 1)
        if self.post_steps is not None:
            _count(self, "post_steps", 0)
        check(self.noise is None or (isinstance(self.noise, (int, float)) and not isinstance(self.noise, bool)
                                     and 0 <= self.noise < 1), "noise", self.noise, "None or a probability in [0, 1)")


@dataclass(kw_only=True, slots=True, frozen=True)
class RooflineConfig:
    """`labkit roofline`: what the roofline's Scenario cannot hold as a flag."""

    no_mtp: bool = False
    """Leave the model's MTP layers out (Scenario.mtp=False)."""

    def __post_init__(self) -> None:
        _flag(self, "no_mtp")


def cmd_bench(args) -> int:
    if args.what == "serve-sync":
        return cmd_serve_sync(args)
    if args.what == "device":  # no SGLang, Ray or Megatron needed: the data path on one device, stage by stage
        from labkit.lab.device.bench import bench_device

        megatron = {"auto": None, "on": True, "off": False}[args.megatron]
        out = bench_device(args.device, size=args.size, deadline_s=args.deadline, warm=args.warm, out=args.out,
                           megatron=megatron, bucket_mb=args.bucket_mb, command=command())
        emit(out, args.json)
        return 0 if out["device/verified"] else 1
    if args.what == "codec":  # no engine, no trainer, no Ray: the codec and the pack alone, on one device
        from labkit.lab.bench.codec import bench_codec

        out = bench_codec(args.device, bucket_mb=args.bucket_mb or 32.0, reps=args.reps)
        write_run(out, args.out)
        emit(out, args.json)
        return 0 if out["bench/codec/verified"] else 1
    from labkit.lab.bench import sync as bench

    spec = model_of(args) or (bench.QUICK_SPEC if args.quick else bench.BENCH_SPEC)
    if args.what == "delta":
        from labkit.lab.bench.delta import bench_delta

        out = bench_delta(spec, bucket_mb=args.bucket_mb or 32.0, syncs=args.reps, progress=not args.json)
    else:
        out = bench.bench_sync(spec, bucket_mb=args.bucket_mb or 32.0, reps=args.reps, progress=not args.json,
                               engine_dtype=None if args.engine_dtype == "auto" else args.engine_dtype)
    write_run(out, args.out)
    emit(out, args.json)
    # a bench whose timed syncs did not all land bitwise measured something else: it fails
    ok = out["bench/delta/verified"] if args.what == "delta" else \
        out["bench/verified"] is True and out["bench/transport_only_verified"] is True
    return 0 if ok else 1


def cmd_serve_sync(args) -> int:
    from labkit.lab.bench import serve as sb

    # Validate every flag before anything starts (ServeBenchConfig names the bad value).
    default = ("abort",) if args.backend == "actor" else sb.MODES  # the actor answers one call at a time
    modes = BenchConfig(modes=args.modes).mode_list() or default
    cfg = sb.ServeBenchConfig(modes=modes, syncs=args.syncs, max_requests=args.max_requests, backend=args.backend)
    from labkit.models.families import model_dir_for

    model = model_of(args)
    out = sb.run(cfg, model_dir=model_dir_for(model) if model else None, progress=not args.json)
    write_run(out, args.out)
    emit(out, args.json)
    return 0 if out["serve/ok"] else 1


def cmd_tune(args) -> int:
    from labkit.lab.bench import sync as bench

    TuneConfig(lo_mb=args.lo_mb, hi_mb=args.hi_mb, memory_budget_mb=args.memory_budget_mb)  # the range, before
    spec = model_of(args) or (bench.QUICK_SPEC if args.quick else bench.BENCH_SPEC)
    out = bench.tune(spec, transport=args.transport, lo_mb=args.lo_mb, hi_mb=args.hi_mb,
                     memory_budget_mb=args.memory_budget_mb, max_trials=args.max_trials, progress=not args.json)
    write_run(out, args.out)
    emit(out, args.json)
    return 0


def cmd_roofline(args) -> int:
    from labkit.lab.roofline import bounds as rf
    from labkit.lab.roofline import notebook as rn
    from labkit.lab.roofline import published as rp

    layout = rf.Layout(**{k: getattr(args, k) for k in ROOFLINE_LAYOUT})
    s = rf.Scenario(**{k: getattr(args, k) for k in ROOFLINE_SCENARIO}, mtp=not args.no_mtp, layout=layout)
    out = rn.run(s)
    write_run(out, args.out, indent=1)
    if args.json:
        emit(out, True)
        return 0
    print(f"{out['roofline/overheads']['measured_on']}\n{out['roofline/overheads']['derivation']}\n")
    for r in out["roofline/transports"]:
        bound_s, predicted_s = rf.fmt_seconds(r["bound_s"]), rf.fmt_seconds(r["predicted_s"])
        print(f"{r['transport']:<30} bound {bound_s:>10}  predicted {predicted_s:>10}  ({r['formula']})")
    print()
    for r in out["roofline/published"]:
        print(rp.describe(r))
    return 0


def cmd_report(args) -> int:
    from labkit.lab.report import generate as report

    problems = report.update(check=args.check)
    stale = [p for p in problems if ":" not in p]  # rebuilt unless --check
    broken = [p for p in problems if ":" in p]  # a missing run, a dirty-tree run, a marker without a table
    print(f"tables {'stale' if args.check else 'rebuilt'} (README.md, docs/): {', '.join(stale) or 'none'}")
    for p in broken:
        print(f"problem: {p}")
    if not args.check:
        for name, where in report.figures().items():
            print(f"figure {name}: {where}")
    return 1 if broken or (args.check and stale) else 0


def cmd_pretrain(args) -> int:
    from labkit.lab.pretrain import pretrain

    out = pretrain(args.out, task=args.task, steps=args.steps, noise=args.noise, post_steps=args.post_steps,
                   progress=not args.json)
    # the checkpoint's record, led by the command, commit, host and versions that made it (a stored run's header)
    write_run({k: v for k, v in out.items() if k != "pretrain/dir"}, str(Path(out["pretrain/dir"]) / "pretrain.json"))
    emit(out, args.json)
    return 0


def add_commands(sub) -> None:
    """bench, tune: measurements (JSON); roofline, report, pretrain: the README's numbers and the checkpoint."""
    d = sub.add_parser("bench", help="benchmarks: " + field_docs(BenchConfig)["what"])
    d.add_argument("what", choices=choices(BenchConfig, "what"), help=field_docs(BenchConfig)["what"])
    add_arguments(d, BenchConfig, ("device", "size", "deadline", "warm", "megatron", "modes"),
                  notes={"modes": f"None: {','.join(ServeBenchConfig().modes)} (--backend actor: abort)."})
    add_arguments(d, ServeBenchConfig, ("syncs", "max_requests", "backend"),
                  notes=dict.fromkeys(("syncs", "max_requests", "backend"), "(serve-sync)"))
    add_model_arguments(d, "the bench's tiny MiMo (serve-sync: a tiny random MiMo)")
    add_arguments(d, BenchConfig, ("bucket_mb", "reps", "quick", "engine_dtype"))
    add_arguments(d, Output, ("out", "json"))
    d.set_defaults(fn=cmd_bench)

    d = sub.add_parser("tune", help="bucket-size sweep under a memory budget + autotuner")
    add_arguments(d, SyncConfig, ("transport",))
    add_arguments(d, TuneConfig, ("lo_mb", "hi_mb", "memory_budget_mb", "max_trials"))
    add_model_arguments(d, "the bench's tiny MiMo")
    add_arguments(d, TuneConfig, ("quick",))
    add_arguments(d, Output, ("out", "json"))
    d.set_defaults(fn=cmd_tune)

    _add_roofline(sub)

    d = sub.add_parser("report", help="rebuild the tables of README.md and docs/ from the stored runs in data/")
    add_arguments(d, ReportConfig, ("check",))
    d.set_defaults(fn=cmd_report)

    d = sub.add_parser("pretrain", help="rebuild a shipped tiny MiMo checkpoint (data/tiny-mimo, data/tiny-mimo-chain)")
    add_arguments(d, PretrainConfig, ("task", "out", "steps", "noise", "post_steps"))
    add_arguments(d, Output, ("json",))
    d.set_defaults(fn=cmd_pretrain)


def _add_roofline(sub) -> None:
    """`labkit roofline`: the flags of the roofline's Scenario and Layout, the stored run's --json --out."""
    from labkit.lab.roofline import bounds as rf
    from labkit.lab.roofline import notebook as rn

    d = sub.add_parser("roofline", description=rn.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                       help="what a sync would cost on GPUs: transport bounds, published systems (--json --out F)")
    add_arguments(d, rf.Scenario, ROOFLINE_SCENARIO, base=rn.REFERENCE)
    add_arguments(d, rf.Layout, ROOFLINE_LAYOUT, base=rn.REFERENCE.layout)
    add_arguments(d, RooflineConfig, ("no_mtp",))
    add_arguments(d, Output, ("json", "out"))
    d.set_defaults(fn=cmd_roofline)
