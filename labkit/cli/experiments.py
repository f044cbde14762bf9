"""`labkit mtp-experiment`, `labkit faults` and `labkit soak`: the experiments whose runs live in data/. Their flags
are the fields of ExperimentConfig (and its RLConfig and TrainConfig), FaultsConfig and SoakConfig, with `None`
meaning "the config's value" where --quick changes it; `ExperimentFlags` and `FaultsFlags` hold the few flags those
configs do not."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from labkit.cli.output import Output, emit, write_run
from labkit.config import add_arguments, check, choices
from labkit.lab.faults.plan import QUICK_KINDS, FaultsConfig
from labkit.lab.soak.config import SoakConfig
from labkit.mtp.experiment import ExperimentConfig
from labkit.mtp.rl import RLConfig, rl_train_config

# ExperimentConfig's own fields, RLConfig's (cfg.rl) and TrainConfig's (cfg.rl.train) that are flags.
EXPERIMENT = ("steps", "k", "spec_temperature", "eval_prompts", "draft_sync_every", "draft_sync_margin", "pre_rl_steps",
              "spec", "task")
RL = ("prompts", "group", "max_new_tokens", "probe")
TRAIN = ("lr", "mtp_lr_mult", "mtp_target", "mtp_clip")
FLAGS = {"spec_temperature": "--temperature"}  # the flag where it is not --field-name


def _int_list(name: str, text: str | None) -> tuple[int, ...] | None:
    """"0,1,2" -> (0, 1, 2); None stays None; anything else is a ValueError naming the field and the value."""
    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"{name}={text!r} is invalid: expected comma-separated integers, e.g. 0,1,2") from None


def _str_list(text: str | None) -> tuple[str, ...] | None:
    return None if text is None else tuple(a.strip() for a in text.split(","))


@dataclass(kw_only=True, slots=True, frozen=True)
class ExperimentFlags:
    """`labkit mtp-experiment`: the comma lists of ExperimentConfig's tuple fields, the model, the run's size and
    what --out keeps. A list is checked by ExperimentConfig itself (one copy of each rule)."""

    arms: str | None = None
    """Comma-separated subset of ExperimentConfig.arms; None: all of them."""
    seeds: str | None = None
    """Comma-separated seeds, one run of every arm each (None: 0,1,2; --quick: 0); the JSON gives means and 95%
    intervals over them."""
    model: str | None = None
    """HF model directory; None: the task's shipped tiny MiMo (data/tiny-mimo, data/tiny-mimo-chain)."""
    quick: bool = False
    """A few seconds per step (tests): ExperimentConfig.quick()'s sizes where a flag does not set them."""
    history: bool = False
    """--out gets every per-step row too."""

    def __post_init__(self) -> None:
        lists = {"arms": _str_list(self.arms), "seeds": _int_list("seeds", self.seeds)}
        dataclasses.replace(ExperimentConfig(), **{k: v for k, v in lists.items() if v is not None})
        check(self.model is None or (isinstance(self.model, str) and self.model.strip() != ""), "model", self.model,
              "None or a non-empty path")
        for f in ("quick", "history"):
            check(isinstance(getattr(self, f), bool), f, getattr(self, f), "True or False")


@dataclass(kw_only=True, slots=True, frozen=True)
class FaultsFlags:
    """`labkit faults`: what the JSON keeps."""

    rows: bool = False
    """Print one row per trial in the stdout JSON too (a stored run, --out, always keeps them)."""

    def __post_init__(self) -> None:
        check(isinstance(self.rows, bool), "rows", self.rows, "True or False")


def cmd_mtp_experiment(args) -> int:
    from labkit.mtp import experiment as ex

    # Validate every flag before anything starts.
    base = ex.ExperimentConfig.quick() if args.quick else ex.ExperimentConfig()
    given = {f: getattr(args, FLAGS.get(f, "--" + f)[2:].replace("-", "_")) for f in (*EXPERIMENT, *RL, *TRAIN)}
    cfg = ex.with_overrides(base, **given, arms=_str_list(args.arms), seeds=_int_list("seeds", args.seeds))
    out = ex.run(cfg, model_dir=args.model, progress=not args.json)
    write_run(out if args.history else out["metrics"], args.out)
    emit(out["metrics"], args.json)
    return 0


def cmd_faults(args) -> int:
    from labkit.lab.faults import harness as fault_harness
    from labkit.lab.faults import plan as faults

    # Validate every flag before anything starts (FaultsConfig names the bad value).
    default = faults.FaultsConfig()
    trials = args.trials if args.trials is not None else (len(faults.QUICK_KINDS) if args.quick else default.trials)
    cfg = faults.FaultsConfig(trials=trials, seed=args.seed, quick=args.quick)
    out = fault_harness.run(cfg)
    write_run(out, args.out)  # a stored run keeps every trial's row: the counts can be checked trial by trial
    emit(out if args.rows else {k: v for k, v in out.items() if k != "faults/rows"}, args.json)
    # recovered counts only trials whose fault provably fired (labkit.lab.faults.plan.counted)
    ok = out["faults/half_updated"] == 0 and out["faults/recovered"] == out["faults/trials"]
    return 0 if ok and out["faults/served_mid_sync"] == 0 else 1


SOAK = ("minutes", "seed", "fault_every", "warmup", "accept_every", "clients", "pause_mode")


def cmd_soak(args) -> int:
    from labkit.lab.soak.run import run

    # Validate every flag before anything starts (SoakConfig names the bad value).
    cfg = SoakConfig(**{f: getattr(args, f) for f in SOAK}, progress=not args.json)
    out = run(cfg)
    write_run(out, args.out)
    emit({k: v for k, v in out.items() if k != "soak/series"}, args.json)
    return 0 if out["soak/ok"] else 1


def _quick_notes(full: object, quick: object, fields: tuple[str, ...]) -> dict[str, str]:
    """{field: "(--quick: V)"} where ExperimentConfig.quick() sets another value than the default."""
    return {f: f"(--quick: {getattr(quick, f)})" for f in fields if getattr(quick, f) != getattr(full, f)}


def add_commands(sub) -> None:
    """mtp-experiment, faults, soak: the experiments whose runs live in data/."""
    d = sub.add_parser("mtp-experiment",
                       help="RL with the MTP draft: arms frozen/trained/unsynced x seeds, acceptance per step")
    full, quick = ExperimentConfig(), ExperimentConfig.quick()
    add_arguments(d, ExperimentConfig, EXPERIMENT, base=full, keep=True, flags=FLAGS,
                  notes=_quick_notes(full, quick, EXPERIMENT))
    add_arguments(d, RLConfig, RL, base=full.rl, keep=True, notes=_quick_notes(full.rl, quick.rl, RL))
    add_arguments(d, type(rl_train_config()), TRAIN, base=rl_train_config(), keep=True)
    add_arguments(d, ExperimentFlags, ("arms", "seeds", "model", "quick"),
                  notes={"arms": f"Arms: {','.join(choices(ExperimentConfig, 'arms'))}."})
    add_arguments(d, Output, ("out",))
    add_arguments(d, ExperimentFlags, ("history",))
    add_arguments(d, Output, ("json",))
    d.set_defaults(fn=cmd_mtp_experiment)

    d = sub.add_parser("faults", help="randomized fault injection at random points of real syncs")
    add_arguments(d, FaultsConfig, ("trials",), keep=True, notes={"trials": f"(--quick: {len(QUICK_KINDS)}, one "
                                                                            "per kind)"})
    add_arguments(d, FaultsConfig, ("seed", "quick"))
    add_arguments(d, FaultsFlags, ("rows",))
    add_arguments(d, Output, ("out", "json"))
    d.set_defaults(fn=cmd_faults)

    d = sub.add_parser("soak", help="an RL run's worth of syncs into two serving engines, with faults: leaks, drift")
    add_arguments(d, SoakConfig, SOAK)
    add_arguments(d, Output, ("out", "json"))
    d.set_defaults(fn=cmd_soak)
