"""OFFLINE ESTIMATE of MTP draft acceptance from one teacher-forced trainer forward (no speculative decoding).

Stand-in for notebook 03 until `labkit.mtp.experiment` lands; 03 switches to it automatically.

MTP head k at position i sees tokens <= i+1 and drafts token i+2+k; the target's greedy choice for that same
token is argmax(logits[:, i+1+k]). Greedy speculative decoding accepts draft k when it equals the target's
choice and every earlier draft in the chain was accepted. Teacher forcing on the task's reference text makes
this an off-policy estimate: on the model's own greedy text the two coincide exactly.

Arms (each a fresh trainer from the same checkpoint, trained with the same batches):
  joint         LM + MTP loss (Megatron's mtp_loss_scaling_factor > 0): the draft follows the policy
  frozen_draft  mtp_loss_scale = 0: the MTP layer gets no gradient, only the shared embedding/head move
"""

from __future__ import annotations

ARMS = {"joint": 0.1, "frozen_draft": 0.0}  # arm -> TrainConfig.mtp_loss_scale


def mtp_available() -> bool:
    """True once `labkit.mtp.experiment` (real speculative decoding) exists; notebook 03 then uses it."""
    import importlib.util

    try:
        return importlib.util.find_spec("labkit.mtp.experiment") is not None
    except ModuleNotFoundError:  # labkit.mtp itself is not there yet
        return False


def greedy_acceptance(logits, mtp_logits: list, mask) -> dict:
    """Chained greedy acceptance over positions whose drafted token is a counted (mask == 1) token.

    Returns accept/length (tokens per target forward: 1 + expected accepted drafts), accept/rate_pos{k}
    (P(draft k accepted | drafts < k accepted)), accept/positions (how many positions were counted).
    """
    import torch

    target = logits.argmax(-1)  # target[:, j]: the target's greedy choice for token j+1
    b, s = target.shape
    n = s - 2  # positions i = 0 .. s-3 draft token i+2 with head 0
    if n <= 0 or not mtp_logits:
        return {"accept/length": 1.0, "accept/positions": 0}
    alive = mask[:, 2:].bool()  # head 0 counts where token i+2 is counted
    counted = int(alive.sum())
    out, expected = {}, torch.zeros(b, n)
    for k, mtp in enumerate(mtp_logits):
        draft = mtp.argmax(-1)[:, :n]  # drafts token i+2+k
        valid = torch.zeros(b, n, dtype=torch.bool)
        hit = torch.zeros(b, n, dtype=torch.bool)
        m = n - k  # positions whose token i+2+k is inside the sequence
        if m > 0:
            valid[:, :m] = mask[:, 2 + k: 2 + k + m].bool()
            hit[:, :m] = draft[:, :m] == target[:, 1 + k: 1 + k + m]
        eligible = alive & valid
        accepted = eligible & hit
        out[f"accept/rate_pos{k + 1}"] = float(accepted.sum()) / max(1, int(eligible.sum()))
        expected += accepted.float()
        alive = accepted
    base = mask[:, 2:].bool()
    out["accept/length"] = 1.0 + float(expected[base].mean()) if counted else 1.0
    out["accept/positions"] = counted
    return out


def run(arms: tuple[str, ...] = ("joint", "frozen_draft"), steps: int = 4, batch_size: int = 16, eval_n: int = 64,
        lr: float = 3e-3, model_dir: str | None = None, progress: bool = True) -> dict:
    """Train each arm `steps` steps on the arithmetic task; estimate acceptance before each step and after the last.

    Returns {"history": [{"arm", "step", "accept/...", "train/loss", "mtp/loss"}...], "metrics": {...}}.
    """
    from tqdm.auto import tqdm

    from labkit.config import ParallelSpec, TrainConfig
    from labkit.tasks import arith
    from labkit.trainer.group import Trainer
    from labkit.workbench import default_model_dir

    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise ValueError(f"arms={unknown!r} is invalid: expected a subset of {', '.join(ARMS)}")
    eval_tokens, eval_mask = arith.batch(arith.problems(eval_n, seed=999_983))
    history = []
    for arm in arms:
        trainer = Trainer(model_dir or default_model_dir(), ParallelSpec(), TrainConfig(lr=lr, mtp_loss_scale=ARMS[arm]))
        try:
            last: dict = {}
            for step in tqdm(range(steps + 1), desc=f"arm {arm}", disable=not progress):
                out = trainer.forward(eval_tokens)
                history.append({"arm": arm, "step": step, **last,
                                **greedy_acceptance(out["logits"], out["mtp_logits"], eval_mask)})
                if step < steps:  # same batches for every arm
                    tokens, mask = arith.batch(arith.problems(batch_size, seed=10_007 * (step + 1)))
                    m = trainer.train_step(tokens, mask)
                    last = {"train/loss": m["train/loss"], "mtp/loss": m["mtp/loss"]}
        finally:
            trainer.shutdown()
    metrics = {"accept/source": "offline-teacher-forced", "accept/steps": steps}
    for arm in arms:
        rows = [h for h in history if h["arm"] == arm]
        metrics.update({f"accept/{arm}/{k.split('/', 1)[1]}": v for k, v in rows[-1].items()
                        if k.startswith("accept/")})
        metrics[f"accept/{arm}/length_first"] = rows[0]["accept/length"]
    return {"history": history, "metrics": metrics}
