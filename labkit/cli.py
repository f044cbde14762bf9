"""The `labkit` command line. Every subcommand with --json ends with one JSON object on the last stdout line.

Flags come from the configs' fields (labkit.config.add_arguments); a subcommand imports what it runs when it
runs, so `labkit --help` and a refused flag load no torch, Ray or SGLang."""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from labkit.cli_io import COMMAND, emit, write_run
from labkit.cli_research import add_research_commands
from labkit.cluster.placement import PlacementSpec
from labkit.compat import quiet
from labkit.config import ParallelSpec, add_arguments
from labkit.engine.config import EngineConfig
from labkit.sync.config import SyncConfig
from labkit.lab.bench.serve import ServeBenchConfig


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


def cmd_sync(args) -> int:
    from labkit.sync.atomic import SyncFailed
    from labkit.workbench import Workbench

    # Validate every flag before anything starts.
    cfg = SyncConfig(transport=args.transport, bucket_mb=args.bucket_mb, memory_budget_mb=args.memory_budget_mb,
                     verify=args.verify, progress=not args.json)
    parallel = ParallelSpec(tp=args.tp, pp=args.pp, ep=args.ep)
    where = PlacementSpec(mode=args.placement, trainer_resource=args.trainer_resource,
                          engine_resource=args.engine_resource, engines=args.engines)
    with Workbench(args.model, parallel, engine_url=args.engine_url, placement=where) as wb:
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


def cmd_pretrain(args) -> int:
    from labkit.models.tiny import DEFAULT_DIR
    from labkit.lab.pretrain import pretrain

    emit(pretrain(args.out or DEFAULT_DIR, steps=args.steps, noise=args.noise, post_steps=args.post_steps,
                   progress=not args.json), args.json)
    return 0


def cmd_bench(args) -> int:
    if args.what == "serve-sync":
        return cmd_serve_sync(args)
    if args.what == "device":  # no SGLang, Ray or Megatron needed: the data path on one device, stage by stage
        from labkit.lab.device.bench import bench_device

        megatron = {"auto": None, "on": True, "off": False}[args.megatron]
        out = bench_device(args.device, size=args.size, deadline_s=args.deadline, warm=args.warm, out=args.out,
                           megatron=megatron, bucket_mb=args.bucket_mb, command=shlex.join(["labkit", *COMMAND]))
        emit(out, args.json)
        return 0 if out["device/verified"] else 1
    if args.what == "codec":  # no engine, no trainer, no Ray: the codec and the pack alone, on one device
        from labkit.lab.bench.codec import bench_codec

        out = bench_codec(args.device, bucket_mb=args.bucket_mb or 32.0, reps=args.reps)
        write_run(out, args.out)
        emit(out, args.json)
        return 0 if out["bench/codec/verified"] else 1
    from labkit.lab.bench import sync as bench

    spec = args.model or (bench.QUICK_SPEC if args.quick else bench.BENCH_SPEC)
    if args.what == "delta":
        from labkit.lab.bench.delta import bench_delta

        out = bench_delta(spec, bucket_mb=args.bucket_mb or 32.0, syncs=args.reps, progress=not args.json)
    else:
        out = bench.bench_sync(spec, bucket_mb=args.bucket_mb or 32.0, reps=args.reps, progress=not args.json)
    write_run(out, args.out)
    emit(out, args.json)
    return 0


def cmd_serve_sync(args) -> int:
    from labkit.lab.bench import serve as sb

    # Validate every flag before anything starts (ServeBenchConfig names the bad value).
    default = ("abort",) if args.backend == "actor" else sb.MODES  # the actor answers one call at a time
    modes = tuple(m.strip() for m in args.modes.split(",")) if args.modes else default
    cfg = sb.ServeBenchConfig(modes=modes, syncs=args.syncs, max_requests=args.max_requests, backend=args.backend)
    from labkit.models.families import model_dir_for

    out = sb.run(cfg, model_dir=model_dir_for(args.model) if args.model else None, progress=not args.json)
    write_run(out, args.out)
    emit(out, args.json)
    return 0 if out["serve/ok"] else 1


def cmd_tune(args) -> int:
    from labkit.lab.bench import sync as bench

    spec = args.model or (bench.QUICK_SPEC if args.quick else bench.BENCH_SPEC)
    out = bench.tune(spec, transport=args.transport, lo_mb=args.lo_mb, hi_mb=args.hi_mb,
                     memory_budget_mb=args.memory_budget_mb, max_trials=args.max_trials, progress=not args.json)
    write_run(out, args.out)
    emit(out, args.json)
    return 0


def cmd_report(args) -> int:
    from labkit.lab.report import generate as report

    stale = report.update(check=args.check)
    print(f"README tables {'stale' if args.check else 'rebuilt'}: {', '.join(stale) or 'none'}")
    if not args.check:
        for name, where in report.figures().items():
            print(f"figure {name}: {where}")
    return 1 if args.check and stale else 0


def _positive_float(name):
    def parse(text):
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}={text!r} is invalid: expected a positive number") from None
        if not v > 0:
            raise argparse.ArgumentTypeError(f"{name}={text!r} is invalid: expected a positive number")
        return v
    return parse


def _model_arguments(d, default: str) -> None:
    from labkit.models.families import FAMILY_SIZES

    d.add_argument("--model", default=None, help=f"a model family ({', '.join(('mimo', *FAMILY_SIZES))}) or an HF "
                                                 f"model directory (default: {default})")
    d.add_argument("--model-dir", dest="model", default=None, help="an HF model directory (as --model DIR)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="labkit", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true", help="show every warning (LABKIT_VERBOSE=1)")
    sub = p.add_subparsers(dest="cmd", required=True)
    for add in (_add_main_commands, _add_bench_commands, add_research_commands, _add_tool_commands):
        add(sub)
    return p


def _add_main_commands(sub) -> None:
    """doctor, demo, sync: the main job and its parts."""
    d = sub.add_parser("doctor", help="versions, devices and active compat layers")
    d.add_argument("--json", action="store_true")
    d.set_defaults(fn=cmd_doctor)

    d = sub.add_parser("demo", help="the main job on the embedded default")
    d.add_argument("--workdir", default="runs/demo")
    d.add_argument("--model", default=None, help="HF model directory (default: data/tiny-mimo)")
    d.add_argument("--steps", type=int, default=10)
    add_arguments(d, ParallelSpec, ("tp", "pp"))
    d.add_argument("--json", action="store_true")
    d.set_defaults(fn=cmd_demo)

    d = sub.add_parser("sync", help="train a few steps, sync into a real SGLang engine, verify, compare greedy")
    add_arguments(d, SyncConfig, ("transport", "bucket_mb", "memory_budget_mb", "verify"))
    _model_arguments(d, "data/tiny-mimo")
    add_arguments(d, EngineConfig, ("url",), base=EngineConfig(model_dir="data/tiny-mimo"),
                  flags={"url": "--engine-url"})
    d.add_argument("--steps", type=int, default=3)
    add_arguments(d, ParallelSpec, ("tp", "pp", "ep"))
    add_arguments(d, PlacementSpec, ("mode", "trainer_resource", "engine_resource", "engines"),
                  flags={"mode": "--placement"})
    d.add_argument("--out", default=None, help="also write the JSON here (led by this command)")
    d.add_argument("--json", action="store_true")
    d.set_defaults(fn=cmd_sync)


def _add_bench_commands(sub) -> None:
    """bench, tune: measurements (JSON)."""
    d = sub.add_parser("bench", help="benchmarks; `labkit bench sync`: per-tensor vs bucketed vs memcpy; "
                                     "`labkit bench serve-sync`: syncs under generate traffic, per pause mode; "
                                     "`labkit bench delta`: full vs delta syncs into a bf16 engine; "
                                     "`labkit bench codec`: the delta codec and the pack alone, on a GPU if any; "
                                     "`labkit bench device`: the colocated data path stage by stage, torch alone")
    d.add_argument("what", choices=["sync", "serve-sync", "delta", "codec", "device"])
    d.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="codec, device: where it runs")
    d.add_argument("--size", choices=["auto", "small", "full"], default="auto",
                   help="device: full (two ~16 GB models; auto on a GPU) or small (auto on CPU)")
    d.add_argument("--deadline", type=_positive_float("deadline"), default=330.0,
                   help="device: seconds for the whole run; stages that would not fit are skipped and said so")
    d.add_argument("--warm", type=int, default=5, help="device: warm syncs per model after the cold one")
    d.add_argument("--megatron", choices=["auto", "on", "off"], default="auto",
                   help="device: stage 5, labkit's Megatron trainer rank without Ray (auto: on a GPU)")
    d.add_argument("--modes", default=None, help="serve-sync: comma-separated pause modes "
                                                 f"(default {','.join(ServeBenchConfig().modes)})")
    add_arguments(d, ServeBenchConfig, ("syncs", "max_requests", "backend"),
                  notes=dict.fromkeys(("syncs", "max_requests", "backend"), "(serve-sync)"))
    _model_arguments(d, "the bench's tiny MiMo (serve-sync: a tiny random MiMo)")
    d.add_argument("--bucket-mb", type=_positive_float("bucket_mb"), default=None,
                   help="bucket size in MiB (default 32; device: 512 on a GPU, 1 on CPU, the held-out size half of it)")
    d.add_argument("--reps", type=int, default=3)
    d.add_argument("--quick", action="store_true", help="a small model (tests)")
    d.add_argument("--out", default=None, help="also write the JSON here")
    d.add_argument("--json", action="store_true")
    d.set_defaults(fn=cmd_bench)

    d = sub.add_parser("tune", help="bucket-size sweep under a memory budget + autotuner")
    add_arguments(d, SyncConfig, ("transport",))
    d.add_argument("--lo-mb", type=_positive_float("lo_mb"), default=0.5)
    d.add_argument("--hi-mb", type=_positive_float("hi_mb"), default=256.0)
    d.add_argument("--memory-budget-mb", type=_positive_float("memory_budget_mb"), default=512.0)
    d.add_argument("--max-trials", type=int, default=6)
    _model_arguments(d, "the bench's tiny MiMo")
    d.add_argument("--quick", action="store_true", help="a small model (tests)")
    d.add_argument("--out", default=None, help="also write the JSON here")
    d.add_argument("--json", action="store_true")
    d.set_defaults(fn=cmd_tune)


def _add_tool_commands(sub) -> None:
    """report, notebook, pretrain."""
    d = sub.add_parser("report", help="rebuild the README's tables from the stored runs in data/")
    d.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table is stale")
    d.set_defaults(fn=cmd_report)

    sub.add_parser("roofline", add_help=False,
                   help="what a sync would cost on GPUs: transport bounds, published systems (--json --out F)")
    sub.add_parser("notebook", add_help=False,
                   help="notebooks headless (papermill): run NAME [-p KEY VALUE]... | sweep NAME -p KEY v1,v2,... "
                        "| list | check")

    d = sub.add_parser("pretrain", help="rebuild the shipped tiny MiMo checkpoint (data/tiny-mimo)")
    d.add_argument("--out", default=None)
    d.add_argument("--steps", type=int, default=2400)
    d.add_argument("--noise", type=float, default=0.25, help="probability an answer digit in the corpus is wrong")
    d.add_argument("--post-steps", type=int, default=600, help="trunk-only post-training steps (the draft goes stale)")
    d.add_argument("--json", action="store_true")
    d.set_defaults(fn=cmd_pretrain)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["notebook"]:  # its own parser: run/sweep/list/check with repeated -p KEY VALUE
        from labkit.workbench import notebook_cli

        return notebook_cli.main(argv[1:])
    if argv[:1] == ["roofline"]:  # its own parser: flags from the roofline's Scenario and Layout
        from labkit.lab.roofline import notebook as roofline_nb

        return roofline_nb.main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.verbose:  # before anything starts: the actors and their children read it (labkit.compat.quiet)
        os.environ[quiet.VERBOSE_ENV] = "1"
    COMMAND[:] = argv
    try:
        return args.fn(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"labkit {args.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
