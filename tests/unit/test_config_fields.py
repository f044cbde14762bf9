"""One field list: allowed values written once (a config's Literal), and the CLI flags and notebook checks read
from it; config modules stay torch-free."""

import argparse
import dataclasses
import subprocess
import sys

import pytest

from labkit import cli
from labkit.cluster.placement import PlacementSpec
from labkit.config import TrainConfig, add_arguments, choices, field_docs
from labkit.engine.config import EngineConfig, SpeculativeConfig
from labkit.mtp.experiment import ExperimentConfig
from labkit.mtp.rl import RLConfig
from labkit.sync.config import SyncConfig
from labkit.workbench import nb
from labkit.lab.faults.plan import FaultsConfig
from labkit.lab.bench.serve import ServeBenchConfig
from labkit.lab.soak.config import SoakConfig

CONFIGS = (TrainConfig, SyncConfig, EngineConfig, SpeculativeConfig, RLConfig, ServeBenchConfig, FaultsConfig,
           SoakConfig)


def test_allowed_values_come_from_the_literal():
    assert choices(SyncConfig, "transport") == ("per-tensor", "colocated", "distributed", "direct")
    assert choices(SyncConfig, "verify") == ("checksum", "full", "none")
    assert choices(EngineConfig, "dtype") == ("auto", "float32", "bfloat16")
    assert choices(TrainConfig, "mtp_target") == ("tokens", "policy", "topk", "tv", "dspark")
    assert choices(ExperimentConfig, "arms") == ("frozen", "trained", "unsynced")  # tuple[Literal, ...]
    assert choices(SyncConfig, "bucket_mb") == ()
    with pytest.raises(ValueError, match=r"^transport='pigeon' is invalid: expected one of per-tensor, colocated"):
        SyncConfig(transport="pigeon")
    for bad in (0, True, "2", 1.5):
        with pytest.raises(ValueError, match=r"^host_threads=.* is invalid: expected None .*or a positive number"):
            SyncConfig(host_threads=bad)
    assert SyncConfig(host_threads=3).host_threads == 3
    assert choices(SyncConfig, "engine_loader") == ("auto", "labkit", "sglang")
    with pytest.raises(ValueError, match=r"^engine_loader='sglang' is invalid: expected auto or labkit with delta"):
        SyncConfig(transport="colocated", delta=4, engine_loader="sglang")
    from labkit.sync.transports.colocated import loader_is_labkit

    assert loader_is_labkit("labkit") and not loader_is_labkit("sglang")  # auto: labkit's without CUDA
    with pytest.raises(ValueError, match=r"^EngineConfig.dtype='fp8' is invalid: expected one of auto, float32"):
        EngineConfig(model_dir="m", dtype="fp8")


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_every_config_field_has_a_one_line_docstring(cls):
    docs = field_docs(cls)
    missing = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)]
    assert not missing, f"{cls.__name__}: fields without a docstring: {missing}"


def _flag(parser, sub, flag):
    sp = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[sub]
    return next(a for a in sp._actions if flag in a.option_strings)


def test_cli_flags_are_generated_from_the_configs():
    p = cli.build_parser()
    t = _flag(p, "sync", "--transport")
    assert t.default == SyncConfig().transport and t.metavar == "{per-tensor,colocated,distributed,direct}"
    assert field_docs(SyncConfig)["transport"] in t.help
    assert _flag(p, "sync", "--bucket-mb").default == SyncConfig().bucket_mb
    assert _flag(p, "sync", "--verify").default == "checksum"
    assert _flag(p, "sync", "--engine-url").default is None and _flag(p, "sync", "--tp").default == 1
    assert _flag(p, "tune", "--transport").default == "colocated"
    assert _flag(p, "bench", "--backend").default == "http" and _flag(p, "bench", "--syncs").default == 3
    mult = _flag(p, "mtp-experiment", "--mtp-lr-mult")
    assert mult.default is None and "(default: 5.0)" in mult.help  # None keeps RLConfig().train's value
    args = p.parse_args(["sync", "--transport", "distributed", "--bucket-mb", "2", "--verify", "full"])
    assert (args.transport, args.bucket_mb, args.verify, args.memory_budget_mb) == ("distributed", 2.0, "full", None)


def test_sync_placement_flags_pin_trainer_and_engines_to_nodes():
    """What tests/integration/test_multinode.py's driver builds directly, from `labkit sync`'s flags."""
    from labkit.cli.main_job import placement_of

    args = cli.build_parser().parse_args(["sync", "--placement", "disaggregated", "--trainer-resource", "trainer",
                                          "--engine-resource", "engine", "--engines", "2"])
    assert placement_of(args) == PlacementSpec(mode="disaggregated", engines=2, trainer_resource="trainer",
                                               engine_resource="engine")
    assert placement_of(cli.build_parser().parse_args(["sync"])) == PlacementSpec()


@pytest.mark.parametrize("argv, needle", [
    (["sync", "--transport", "pigeon"], "transport='pigeon' is invalid: expected one of per-tensor, colocated"),
    (["sync", "--bucket-mb", "0"], "bucket_mb='0' is invalid: expected a positive number of MiB"),
    (["sync", "--bucket-mb", "abc"], "bucket_mb='abc' is invalid: expected a number"),
    (["sync", "--verify", "none"], "verify='none' is refused by the atomic guard"),
    (["sync", "--engine-url", "ftp://x"], "url='ftp://x' is invalid"),
    (["tune", "--transport", "x"], "transport='x' is invalid"),
    (["bench", "serve-sync", "--backend", "grpc"], "backend='grpc' is invalid: expected one of http, actor"),
    (["mtp-experiment", "--mtp-target", "kl"], "mtp_target='kl' is invalid: expected one of tokens, policy"),
])
def test_bad_flags_fail_at_parse_time_naming_the_field(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(argv)
    assert e.value.code == 2 and needle in capsys.readouterr().err


def test_add_arguments_keeps_a_cross_field_rule_for_the_constructor():
    p = argparse.ArgumentParser()
    add_arguments(p, SyncConfig, ("bucket_mb", "memory_budget_mb"))
    a = p.parse_args(["--memory-budget-mb", "100"])  # vs the default bucket: the constructor names bucket_mb
    with pytest.raises(ValueError, match="^bucket_mb=64.0"):
        SyncConfig(bucket_mb=a.bucket_mb, memory_budget_mb=a.memory_budget_mb)


def test_notebook_choices_come_from_the_configs():
    assert nb.Choice.of(SyncConfig, "transport").values == choices(SyncConfig, "transport")
    assert nb.Choice.of(SyncConfig, "verify", exclude=("none",)).values == ("checksum", "full")
    assert nb.Subset.of(ExperimentConfig, "arms").ok("trained,frozen")
    with pytest.raises(ValueError, match="TRANSPORT='carrier-pigeon' is invalid: expected one of 'per-tensor'"):
        nb.check_params({"TRANSPORT": "carrier-pigeon"}, {"TRANSPORT": nb.Choice.of(SyncConfig, "transport")})


def test_notebooks_restate_no_allowed_values():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "notebooks"
    for py in sorted(root.glob("*.py")):
        text = py.read_text()
        for values in (choices(SyncConfig, "transport"), choices(ExperimentConfig, "arms")):
            assert f'"{values[1]}", "{values[2]}"' not in text, f"{py.name} restates {values}"


def test_config_modules_do_not_import_torch():
    code = ("import sys, labkit.config, labkit.sync.config, labkit.engine.config, labkit.mtp.rl, labkit.cli; "
            "print(sorted(m for m in ('torch', 'ray', 'sglang', 'megatron', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def _subparsers(parser):
    """(argv prefix, parser) for every subcommand, notebook's actions included."""
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sp in a.choices.items():
                yield [name], sp
                for more, ssp in _subparsers(sp):
                    yield [name, *more], ssp


HAND_WRITTEN = {"-h", "-p"}  # help, and notebook's repeated `-p KEY VALUE` pairs (no field holds a pair list)


def test_every_flag_is_a_config_field_with_its_docstring():
    from labkit.cli import experiments, lab, main_job, notebooks, output
    from labkit.cluster.placement import PlacementSpec
    from labkit.config import ParallelSpec
    from labkit.lab.roofline.bounds import Layout, Scenario

    configs = (SyncConfig, EngineConfig, ParallelSpec, PlacementSpec, ServeBenchConfig, FaultsConfig, ExperimentConfig,
               RLConfig, TrainConfig, Scenario, Layout, output.Output, output.ModelFlags, main_job.JobConfig,
               lab.BenchConfig, lab.TuneConfig, lab.ReportConfig, lab.PretrainConfig, lab.RooflineConfig,
               experiments.ExperimentFlags, experiments.FaultsFlags, notebooks.NotebookRunConfig, SoakConfig)
    docs = {d for cls in configs for d in field_docs(cls).values()}
    seen = 0
    for argv, sp in _subparsers(cli.build_parser()):
        for a in sp._actions:
            if not a.option_strings or HAND_WRITTEN & set(a.option_strings):
                continue
            seen += 1
            assert any(a.help.replace("%%", "%").startswith(d) for d in docs), (argv, a.option_strings, a.help)
    assert seen > 80


@pytest.mark.parametrize("cmd, flag, default, shown", [
    ("tune", "--lo-mb", 0.5, None), ("tune", "--memory-budget-mb", 512.0, None), ("tune", "--max-trials", 6, None),
    ("faults", "--trials", None, "(default: 33)"), ("faults", "--seed", 0, None), ("pretrain", "--steps", None, None),
    ("pretrain", "--noise", None, None), ("pretrain", "--post-steps", None, None), ("bench", "--deadline", 330.0, None),
    ("bench", "--warm", 5, None), ("bench", "--reps", 3, None), ("bench", "--device", "auto", None),
    ("mtp-experiment", "--steps", None, "(--quick: 2) (default: 60)"), ("mtp-experiment", "--temperature", None,
                                                                        "(default: 1.0)"),
    ("mtp-experiment", "--prompts", None, "(--quick: 4) (default: 64)"), ("demo", "--steps", 10, None),
    ("sync", "--steps", 3, None), ("demo", "--workdir", "runs/demo", None), ("roofline", "--bucket-mb", 512, None),
])
def test_defaults_are_kept(cmd, flag, default, shown):
    a = _flag(cli.build_parser(), cmd, flag)
    assert a.default == default and (shown is None or shown in a.help), (a.default, a.help)


@pytest.mark.parametrize("argv, needle", [
    (["tune", "--lo-mb", "0"], "lo_mb='0' is invalid: expected a positive number"),
    (["tune", "--max-trials", "0"], "max_trials='0' is invalid: expected an integer >= 1"),
    (["bench", "device", "--deadline", "0"], "deadline='0' is invalid: expected a positive number"),
    (["bench", "device", "--size", "huge"], "size='huge' is invalid: expected one of auto, small, full"),
    (["bench", "serve-sync", "--modes", "abort,nap"], "modes='abort,nap' is invalid: expected comma-separated pause"),
    (["faults", "--trials", "0"], "trials='0' is invalid: expected an integer >= 1"),
    (["pretrain", "--noise", "2"], "noise='2' is invalid: expected None or a probability in [0, 1)"),
    (["mtp-experiment", "--arms", "trained,pigeon"], "arms='trained,pigeon' is invalid: expected a non-empty subset"),
    (["mtp-experiment", "--seeds", "0,a"], "seeds='0,a' is invalid: expected comma-separated integers"),
    (["mtp-experiment", "--seeds", "1,1"], "seeds='1,1' is invalid: expected a non-empty tuple of distinct"),
    (["mtp-experiment", "--steps", "0"], "steps='0' is invalid: expected an integer >= 1"),
    (["notebook", "run", "01", "--timeout", "0"], "timeout='0' is invalid: expected an integer >= 1"),
])
def test_bad_values_of_generated_flags_name_the_value(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(argv)
    assert e.value.code == 2 and needle in capsys.readouterr().err


def test_a_range_checked_across_two_flags_fails_before_anything_starts(capsys):
    assert cli.main(["tune", "--lo-mb", "8", "--hi-mb", "4"]) == 2
    assert "lo_mb..hi_mb=(8.0, 4.0) is invalid: expected lo_mb <= hi_mb" in capsys.readouterr().err
    args = cli.build_parser().parse_args(["tune", "--lo-mb", "300", "--hi-mb", "512"])  # each alone is fine
    assert (args.lo_mb, args.hi_mb) == (300.0, 512.0)


def test_every_help_works_and_loads_no_heavy_stack():
    """`labkit --help` and every subcommand's --help print, and none of them imports torch, Ray or SGLang."""
    code = ("import contextlib, io, sys\n"
            "from labkit.cli import main\n"
            "subs = [[], ['doctor'], ['demo'], ['sync'], ['bench'], ['tune'], ['roofline'], ['report'], ['pretrain'],\n"
            "        ['mtp-experiment'], ['faults'], ['notebook'], ['notebook', 'run'], ['notebook', 'sweep'],\n"
            "        ['notebook', 'list'], ['notebook', 'check']]\n"
            "for argv in subs:\n"
            "    buf = io.StringIO()\n"
            "    try:\n"
            "        with contextlib.redirect_stdout(buf):\n"
            "            main([*argv, '--help'])\n"
            "    except SystemExit as e:\n"
            "        assert e.code == 0 and buf.getvalue().startswith('usage: labkit'), (argv, e.code)\n"
            "print(sorted(m for m in ('torch', 'ray', 'sglang', 'megatron', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
