"""MTP-aware RL: the MTP draft during training, speculative decoding with it, and how often its drafts are accepted.

`acceptance` is pure math (counters, theory, the offline estimate, SGLang's meta_info); `speculative` is labkit's
own draft-and-verify loop over exported weights; the rest wires them into RL.
"""
