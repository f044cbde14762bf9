"""The MTP tables (docs/mtp.md, docs/draft-objectives.md; labkit.lab.report.generate): the default three-arm run,
and the draft objectives and cadences compared, paired seed by seed with the default run's frozen arm.

Every comparison row pairs by seed: the arms of a seed see token-identical rollouts (seeded sampling, a draft that
cannot move the policy, a pre-RL phase that leaves the trunk bit for bit), so the differences are the draft's alone.
"""

from __future__ import annotations

from labkit.lab.report.markdown import md_head, md_row
from labkit.mtp import positions, stats


def _pct(x) -> str:
    return "n/a (one arm)" if x is None else f"{x:.0%}"


def _ci(mean, ci) -> str:
    return f"{mean:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else " (one seed: no interval)")


def mtp_table(run: dict) -> list[str]:
    m = run.get("metrics", run)
    head = ["arm", "final accept rate, mean [95 % CI]", "last quarter, mean [95 % CI]", "final reward",
            "final accept rate per seed"]
    lines = md_head(head)
    for arm in m["mtp/arms"]:
        per = ", ".join(f"{s[f'mtp/final_accept_rate_{arm}']:.3f}" for s in m["mtp/per_seed"])
        lines.append(md_row([arm, _ci(m[f"mtp/final_accept_rate_{arm}_mean"], m[f"mtp/final_accept_rate_{arm}_ci95"]),
                           _ci(m[f"mtp/tail_accept_rate_{arm}_mean"], m[f"mtp/tail_accept_rate_{arm}_ci95"]),
                           f"{m[f'mtp/final_reward_{arm}']:.3f}", per]))
    lines.append("")
    if "mtp/diff_trained_frozen_mean" in m:
        final = _ci(m["mtp/diff_trained_frozen_mean"], m["mtp/diff_trained_frozen_ci95"])
        tail = _ci(m["mtp/diff_trained_frozen_tail_mean"], m["mtp/diff_trained_frozen_tail_ci95"])
        lines.append(f"- trained − frozen, paired by seed (final): {final}; last quarter: {tail}")
    if "mtp/unsynced_lowest_all_seeds" in m:
        lines.append(f"- unsynced lowest in every seed: {m['mtp/unsynced_lowest_all_seeds']}; its draft, read back "
                     f"from the engine, equalled the trainer's at step 0: "
                     f"{m.get('mtp/unsynced_engine_draft_step0_equal')}, and differed from it at every later step: "
                     f"{m.get('mtp/unsynced_engine_draft_stale_after')}")
    lines.append(f"- evaluation on held-out problems, disjoint from pretraining and RL (`mtp/eval_disjoint`): "
                 f"{m['mtp/eval_disjoint']}; rollouts token-identical across arms at step 0: "
                 f"{m['mtp/rollouts_identical_step0']}, at later steps: {_pct(m['mtp/rollouts_identical_fraction'])}")
    if "mtp/offline_err_step_mean" in m:
        lines.append(f"- offline estimate's error per step: mean {m['mtp/offline_err_step_mean']:.3f}, "
                     f"max {m['mtp/offline_err_step_max']:.3f}")
    lines.append(f"- at step 0 (every arm): accept rate {m['mtp/start_accept_rate']:.3f}, reward "
                 f"{m['mtp/start_reward']:.3f}")
    lines.append(f"- seeds {m['mtp/seeds']}, {m['mtp/steps']} steps per arm, k = {m['mtp/k']}, "
                 f"{m['timing/mtp_experiment/total'] / 60:.1f} min{host_phrase(run)}")
    return lines


def host_phrase(run: dict) -> str:
    """` on <host>` from the machine the stored run recorded (its `provenance.host`, labkit.provenance: a dict of
    cores and CPU model; or a `host` at its top or among its metrics), "" when it recorded none: the table then
    claims no box for the time."""
    m = run.get("metrics", run)
    host = (run.get("provenance") or {}).get("host") or run.get("host") or m.get("host")
    if isinstance(host, dict):
        cores = host.get("cores") or host.get("cpu_count")
        model = host.get("cpu_model") or host.get("cpu")
        words = ([f"{cores} cores"] if cores else []) + ([str(model)] if model else [])
        host = ", ".join(words) or host.get("name")
    return f" on {host}" if host else ""


def _records(run: dict) -> list[dict]:
    """The metric records a stored file holds: one for a `labkit mtp-experiment` run, one per finished value for
    a `labkit notebook sweep --save` file."""
    if "rows" in run:
        return [r for r in run["rows"] if r.get("status") == "ok"]
    return [run.get("metrics", run)]


def _arms(m: dict) -> list[str]:
    pre = "mtp/final_accept_rate_"  # not its per-depth keys, mtp/final_accept_rate_pos_{j}_{arm}
    return [k.removeprefix(pre) for k in m["mtp/per_seed"][0] if k.startswith(pre) and not k.startswith(pre + "pos_")]


def cadence(m: dict, arm: str) -> str | None:
    """How the draft followed the policy in this arm, or None for an arm that compares nothing (the plain frozen
    baseline, the unsynced failure mode)."""
    pre = m.get("mtp/pre_rl_steps") or 0
    if arm == "frozen":
        return f"pre-RL only ({pre} MTP-only steps)" if pre else None
    if arm != "trained":
        return None
    every, margin = m.get("mtp/draft_sync_every", 1), m.get("mtp/draft_sync_margin") or 0
    text = "every step" if every == 1 else f"every {every} steps"
    if margin:
        text = f"once its acceptance EMA fell {margin:g}"
    return text + (f", after {pre} pre-RL steps" if pre else "")


def draft_rows(runs: list[tuple[str, dict]], baseline: dict) -> list[dict]:
    """One row per (stored record, arm) that compares a draft schedule: its objective, cadence, final and
    last-quarter acceptance over seeds, and both paired with the baseline's frozen arm by seed."""
    base = {s["mtp/seed"]: s for s in baseline.get("metrics", baseline)["mtp/per_seed"]}
    out = []
    for name, run in runs:
        for m in _records(run):
            for arm in _arms(m):
                when = cadence(m, arm)
                if when is None:
                    continue
                per = m["mtp/per_seed"]
                seeds = [s["mtp/seed"] for s in per]
                out.append({"file": name, "objective": m.get("mtp/target", "tokens"), "cadence": when,
                            "arm": arm, "seeds": seeds, "draft_bytes": m.get(f"mtp/draft_sync_bytes_{arm}"),
                            "final": (m[f"mtp/final_accept_rate_{arm}_mean"], m[f"mtp/final_accept_rate_{arm}_ci95"]),
                            "tail": (m[f"mtp/tail_accept_rate_{arm}_mean"], m[f"mtp/tail_accept_rate_{arm}_ci95"]),
                            "diff_final": stats.paired([s[f"mtp/final_accept_rate_{arm}"] for s in per],
                                                       [base[x]["mtp/final_accept_rate_frozen"] for x in seeds]),
                            "diff_tail": stats.paired([s[f"mtp/tail_accept_rate_{arm}"] for s in per],
                                                      [base[x]["mtp/tail_accept_rate_frozen"] for x in seeds])})
    return out


def drafts_table(run: dict) -> list[str]:
    """What the draft learns and when, over seeds; each row minus the default run's frozen arm, paired by seed."""
    head = ["objective (`MTP_TARGET`)", "cadence", "final accept rate, mean [95 % CI]", "last quarter",
            "final − frozen, paired", "last quarter − frozen, paired", "draft MB synced per run", "seeds"]
    lines = md_head(head)
    for r in draft_rows(run["runs"], run["baseline"]):
        sent = "not recorded" if r["draft_bytes"] is None else f"{r['draft_bytes'] / 1e6:.1f}"
        lines.append(md_row([r["objective"], r["cadence"], _ci(*r["final"]), _ci(*r["tail"]), _ci(*r["diff_final"]),
                             _ci(*r["diff_tail"]), sent, ", ".join(map(str, r["seeds"]))]))
    return lines


def draft_inputs_table(run: dict) -> list[str]:
    """`scripts/draft_inputs_ab.py`: labkit's loop with the trainer's draft inputs and with SGLang's (position 0's
    token embedding zeroed), per temperature and drafts per step."""
    rows = {(r["temperature"], r["k"], r["draft_inputs"]): r for r in run["runs"]}
    lines = md_head(["T", "k", "accept rate: trainer's inputs", "SGLang's inputs", "accept length: trainer's",
                     "SGLang's", "depth 1: trainer's", "SGLang's"])
    for t, k in sorted({(t, k) for t, k, _ in rows}):
        a, b = rows[(t, k, "trainer")], rows[(t, k, "sglang")]
        lines.append(md_row([f"{t:g}", k, f"{a['mtp/accept_rate']:.3f}", f"{b['mtp/accept_rate']:.3f}",
                             f"{a['mtp/accept_length']:.2f}", f"{b['mtp/accept_length']:.2f}",
                             f"{a['mtp/accept_rate_pos_1']:.3f}", f"{b['mtp/accept_rate_pos_1']:.3f}"]))
    return lines + ["", f"The shipped tiny MiMo (pretrained without the zeroing) on {run['prompts']} held-out "
                        f"problems, answers of at most {run['max_new_tokens']} tokens; the same target, weights and "
                        "seeds in both columns, only the draft's input at position 0 differs."]


def engine_table(run: dict) -> list[str]:
    """`labkit mtp-experiment --spec engine`: acceptance from SGLang's own counters per arm (primary), labkit's
    loop beside it at the same temperature, the greedy cross-check's worst step, and the draft's speed."""
    m = run.get("metrics", run)
    head = ["arm", "engine counters: final accept rate, mean [95 % CI]", "last quarter, mean [95 % CI]",
            "labkit's loop, same T (final, mean)", "spec/speedup, mean [95 % CI]"]
    lines = md_head(head)
    for arm in m["mtp/arms"]:
        loop = [s[f"mtp/final_loop_accept_rate_{arm}"] for s in m["mtp/per_seed"]]
        lines.append(md_row([arm, _ci(m[f"mtp/final_accept_rate_{arm}_mean"], m[f"mtp/final_accept_rate_{arm}_ci95"]),
                           _ci(m[f"mtp/tail_accept_rate_{arm}_mean"], m[f"mtp/tail_accept_rate_{arm}_ci95"]),
                           f"{sum(loop) / len(loop):.3f}",
                           _ci(m[f"spec/speedup_{arm}_mean"], m[f"spec/speedup_{arm}_ci95"])]))
    lines.append("")
    depths = ", ".join(f"depth {k.rsplit('_', 2)[-2]}: {v:.4f}" for k, v in sorted(m.items())
                       if k.startswith("mtp/engine_vs_loop_accept_diff_pos_") and k.endswith("_max"))
    lines.append(f"- greedy cross-check, engine counters vs labkit's loop on SGLang's draft inputs, worst step "
                 f"(`mtp/engine_vs_loop_accept_diff`): {m['mtp/engine_vs_loop_accept_diff_max']:.4f} ({depths})")
    carried = m.get("mtp/draft_syncs_verified")  # counted from a3adf59 on; earlier runs record the flag alone
    lines.append(f"- every sync into the speculative engine verified, the draft runner's copies included: "
                 f"{m['mtp/draft_verified_every_step']}"
                 + (f" ({carried} syncs carried the draft)" if carried is not None else "")
                 + f"; the draft runner held what the draft store held at every step: "
                 f"{m['mtp/draft_runner_is_store_every_step']}")
    if "mtp/diff_trained_frozen_mean" in m:
        lines.append(f"- trained − frozen by the engine's counters, paired by seed (final): "
                     f"{_ci(m['mtp/diff_trained_frozen_mean'], m['mtp/diff_trained_frozen_ci95'])}")
    if "mtp/unsynced_lowest_all_seeds" in m:
        lines.append(f"- unsynced lowest in every seed by the engine's counters: {m['mtp/unsynced_lowest_all_seeds']}")
    lines.append(f"- rollouts token-identical across arms at step 0: {m['mtp/rollouts_identical_step0']}, at later "
                 f"steps: {_pct(m['mtp/rollouts_identical_fraction'])}; evaluation held out: {m['mtp/eval_disjoint']}")
    lines.append(f"- seeds {m['mtp/seeds']}, {m['mtp/steps']} steps per arm, k = {m['mtp/k']}, T = "
                 f"{m['mtp/spec_temperature']}, {m['timing/mtp_experiment/total'] / 60:.1f} min{host_phrase(run)}")
    return lines


def long_table(run: dict) -> list[str]:
    """`labkit mtp-experiment --task chain`: the long-answer task, acceptance over the whole generation from the
    engine's counters, and by position within the generation (bins of 32 tokens) from labkit's loop at the same
    temperature (the engine counts per request, not per position), per arm over seeds."""
    m = run.get("metrics", run)
    arms = list(m["mtp/arms"])
    loop, bins = positions.summary_bins(m, arms[0])
    whole_loop = f"mtp/final_loop_accept_rate_{arms[0]}" in m
    head = ["arm", ("engine counters, " if whole_loop else "") + "whole generation, mean [95 % CI]"] + \
        (["loop, whole"] if whole_loop else []) + \
        [f"loop, tokens {b.replace('_', '–')}" for b in bins]
    if f"spec/speedup_{arms[0]}_mean" in m:
        head.append("spec/speedup")
    lines = md_head(head)
    for arm in arms:
        row = [arm, _ci(m[f"mtp/final_accept_rate_{arm}_mean"], m[f"mtp/final_accept_rate_{arm}_ci95"])]
        row += [f"{m[f'mtp/final_loop_accept_rate_{arm}']:.3f}"] if whole_loop else []
        row += [_ci(m[f"{loop}{b}_{arm}_mean"], m[f"{loop}{b}_{arm}_ci95"]) for b in bins]
        if f"spec/speedup_{arm}_mean" in m:
            row.append(_ci(m[f"spec/speedup_{arm}_mean"], m[f"spec/speedup_{arm}_ci95"]))
        lines.append(md_row(row))
    lines.append("")
    where = "labkit's loop" if loop.startswith("mtp/final_loop") else "the measuring instrument"
    lines.append(f"- whole generation: {'the engine counters' if whole_loop else where}; by position: {where} at "
                 f"T = {m['mtp/spec_temperature']}, final step, the drafts proposed for output positions in each bin "
                 "(accepted / proposed, pooled over the held-out prompts; mean [95 % CI] over seeds)")
    if "mtp/engine_vs_loop_accept_diff_max" in m:
        lines.append(f"- greedy cross-check, engine counters vs labkit's loop, worst step: "
                     f"{m['mtp/engine_vs_loop_accept_diff_max']:.4f}; every sync into the speculative engine "
                     f"verified on its draft runner: {m['mtp/draft_verified_every_step']}")
    if "mtp/diff_trained_frozen_mean" in m:
        lines.append(f"- trained − frozen, paired by seed (final, whole generation): "
                     f"{_ci(m['mtp/diff_trained_frozen_mean'], m['mtp/diff_trained_frozen_ci95'])}")
    rewards = ", ".join(f"{arm} {m[f'mtp/final_reward_{arm}']:.3f}" for arm in arms)
    lines.append(f"- final reward (correct-prefix share of the answer): {rewards}; start {m['mtp/start_reward']:.3f}")
    lines.append(f"- rollouts token-identical across arms at step 0: {m['mtp/rollouts_identical_step0']}, later: "
                 f"{_pct(m['mtp/rollouts_identical_fraction'])}; evaluation held out: {m['mtp/eval_disjoint']}")
    lines.append(f"- seeds {m['mtp/seeds']}, {m['mtp/steps']} steps per arm, k = {m['mtp/k']}, max_new_tokens "
                 f"{m.get('mtp/max_new_tokens')}, {m['timing/mtp_experiment/total'] / 60:.1f} min{host_phrase(run)}")
    return lines
