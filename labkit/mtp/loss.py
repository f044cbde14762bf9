"""The trunk-detached MTP loss, as the MTP layer names it: the hooks and the policy-KL target.

They are hooks on the trainer's Megatron model, switched by `TrainConfig` (mtp_detach, mtp_target,
mtp_loss_scale), so they live in `labkit.trainer.mtp_loss` (the trainer may not import mtp/: imports point
down); this module keeps the name that the README and the MTP experiments cite.
"""

from labkit.trainer.mtp_loss import capture_mtp, detach_trunk, freeze_mtp, policy_loss

__all__ = ["capture_mtp", "detach_trunk", "freeze_mtp", "policy_loss"]
