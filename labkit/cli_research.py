"""`labkit mtp-experiment` and `labkit faults`: the experiments whose runs live in data/."""

from __future__ import annotations

from labkit.cli_io import emit, write_run
from labkit.config import add_arguments, choices
from labkit.mtp.experiment import ExperimentConfig
from labkit.mtp.rl import rl_train_config


def _int_list(flag: str, text: str | None) -> tuple[int, ...] | None:
    """"0,1,2" -> (0, 1, 2); None stays None; anything else is a ValueError naming the flag and the value."""
    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"{flag}={text!r} is invalid: expected comma-separated integers, e.g. 0,1,2") from None


def cmd_mtp_experiment(args) -> int:
    from labkit.mtp import experiment as ex

    # Validate every flag before anything starts.
    base = ex.ExperimentConfig.quick() if args.quick else ex.ExperimentConfig()
    arms = tuple(a.strip() for a in args.arms.split(",")) if args.arms else None
    cfg = ex.with_overrides(base, steps=args.steps, arms=arms, k=args.k, spec_temperature=args.temperature,
                            eval_prompts=args.eval_prompts, draft_sync_every=args.draft_sync_every,
                            pre_rl_steps=args.pre_rl_steps,
                            seeds=_int_list("--seeds", args.seeds), prompts=args.prompts, group=args.group,
                            lr=args.lr, mtp_lr_mult=args.mtp_lr_mult, mtp_target=args.mtp_target,
                            mtp_clip=args.mtp_clip)
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
    if not args.rows:
        out.pop("faults/rows", None)
    write_run(out, args.out)
    emit(out, args.json)
    ok = out["faults/half_updated"] == 0 and out["faults/recovered"] == out["faults/trials"]
    return 0 if ok and out["faults/served_mid_sync"] == 0 else 1


def add_research_commands(sub) -> None:
    """mtp-experiment, faults: the experiments whose runs live in data/."""
    d = sub.add_parser("mtp-experiment",
                       help="RL with the MTP draft: arms frozen/trained/unsynced x seeds, acceptance per step")
    d.add_argument("--steps", type=int, default=None, help="RL steps per arm (default 60; --quick: 2)")
    d.add_argument("--arms", default=None,
                   help=f"comma-separated subset of {','.join(choices(ExperimentConfig, 'arms'))}")
    d.add_argument("--k", type=int, default=None, help="drafts per verify step, k (default 1, MiMo's recipe; SGLang's "
                   "num_draft_tokens is k + 1)")
    d.add_argument("--temperature", type=float, default=None, help="speculative sampling temperature (default 1)")
    d.add_argument("--eval-prompts", type=int, default=None)
    d.add_argument("--prompts", type=int, default=None, help="prompts per RL step")
    d.add_argument("--group", type=int, default=None, help="samples per prompt (GRPO group)")
    add_arguments(d, type(rl_train_config()), ("lr", "mtp_lr_mult", "mtp_target", "mtp_clip"), base=rl_train_config(),
                  keep=True)
    d.add_argument("--draft-sync-every", type=int, default=None, help="cadence: the trained arms' syncs carry the "
                   "draft every N-th step only (default 1)")
    d.add_argument("--pre-rl-steps", type=int, default=None, help="MTP-only steps on the initial policy's rollouts "
                   "before RL, every arm's draft starting there (Bebop; with --arms frozen: the pre-RL-only cadence)")
    d.add_argument("--seeds", default=None, help="comma-separated seeds, one run of every arm each (default 0,1,2; "
                   "--quick: 0); the JSON gives means and 95%% intervals over them")
    d.add_argument("--model", default=None, help="HF model directory (default: data/tiny-mimo)")
    d.add_argument("--quick", action="store_true", help="a few seconds per step (tests)")
    d.add_argument("--out", default=None, help="also write the JSON here")
    d.add_argument("--history", action="store_true", help="--out gets every per-step row too")
    d.add_argument("--json", action="store_true")
    d.set_defaults(fn=cmd_mtp_experiment)

    d = sub.add_parser("faults", help="randomized fault injection at random points of real syncs")
    d.add_argument("--trials", type=int, default=None,
                   help="number of trials (default 33: three rounds of the 11 kinds; --quick: one per kind)")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--quick", action="store_true", help="only the faults that restart nothing, one trial each (tests)")
    d.add_argument("--rows", action="store_true", help="include one row per trial in the JSON")
    d.add_argument("--out", default=None, help="also write the JSON here")
    d.add_argument("--json", action="store_true")
    d.set_defaults(fn=cmd_faults)
