"""When the trained arms' syncs carry the MTP draft layers: every N-th step, or when acceptance has dropped.

A draft synced every step costs its bytes every step; one never synced decays (SGLang #37326: acceptance near 0
after a day). Two cadences between those:
- every N-th step (`every`, ExperimentConfig.draft_sync_every): steps N-1, 2N-1, ... carry the draft;
- acceptance-driven (`margin` > 0, ExperimentConfig.draft_sync_margin), as verl-SpeCo drives its cadence by an
  acceptance EMA: each step's measured acceptance (of the draft the engine holds) feeds an exponential moving average
  (`decay`); the first measurement after a draft sync anchors it, and once the average has fallen `margin` below
  that anchor the step's sync carries the draft, and the next measurement anchors again.
Pure (property-tested in tests/unit/test_cadence.py); the experiment counts the bytes each cadence sends
(`mtp/draft_sync_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from labkit.config import check

DECAY = 0.5  # the EMA's weight on its past: acceptance on 256 prompts moves ~0.04 step to step by noise alone


@dataclass
class Cadence:
    every: int = 1
    margin: float = 0.0
    decay: float = DECAY
    _ema: float | None = field(default=None, repr=False)
    _anchor: float | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        check(isinstance(self.every, int) and not isinstance(self.every, bool) and self.every >= 1,
              "draft_sync_every", self.every, "an integer >= 1")
        check(isinstance(self.margin, (int, float)) and 0.0 <= self.margin < 1.0, "draft_sync_margin", self.margin,
              "a number in [0, 1) (0: no acceptance-driven cadence)")
        check(self.margin == 0 or self.every == 1, "draft_sync_margin", self.margin,
              "0 when draft_sync_every > 1 (one cadence at a time)")
        check(0.0 < self.decay < 1.0, "decay", self.decay, "a number in (0, 1)")

    @property
    def stale_between(self) -> bool:
        """Whether the engine's draft can differ from the trainer's between syncs (then it is read back)."""
        return self.every > 1 or self.margin > 0

    def carries(self, step: int, accept_rate: float) -> bool:
        """Whether step `step`'s sync carries the draft layers, given the acceptance measured at its start."""
        if self.margin == 0:
            return (step + 1) % self.every == 0
        self._ema = accept_rate if self._ema is None else self.decay * self._ema + (1 - self.decay) * accept_rate
        if self._anchor is None:
            self._anchor = self._ema
        if self._ema < self._anchor - self.margin:
            self._ema = self._anchor = None  # the synced draft is measured afresh
            return True
        return False
