"""The memory a sync really adds, measured by the kernel, beside the planned figure (`sync/peak_extra_bytes`).

The plan counts the buffers it allocates (two flat buckets, an oversize one travelling alone); what it cannot count are
the transients: a tensor cast to the engine's dtype before packing, a gathered export tensor, a delta's change mask.
Linux keeps a high-water mark of each process's resident memory (`VmHWM`) and resets it to the current size on
`echo 5 > /proc/self/clear_refs`, so the peak over a block is exact, with no sampling and nothing to miss between
samples. Resident memory includes shared mappings this process touches: the atomic guard's host copy
(`sync/stage_bytes`, reported on its own) shows up in it, so the bench reads the measured peak from syncs without the
guard. Elsewhere (no /proc, a kernel that refuses the reset) it reports None rather than a guess.
"""

from __future__ import annotations

from pathlib import Path

_STATUS, _CLEAR = Path("/proc/self/status"), Path("/proc/self/clear_refs")


def _kib(field: str) -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class PeakRSS:
    """`m = PeakRSS().start(); ...; m.stop()`, or `with PeakRSS() as m:`; then `m.rise`: bytes the process's
    resident peak rose above its size at `start` (None where the kernel does not offer the reset)."""

    def __init__(self):
        self.base: int | None = None
        self.rise: int | None = None

    def start(self) -> PeakRSS:
        try:
            _CLEAR.write_text("5")  # VmHWM := VmRSS
        except OSError:
            return self
        self.base = _kib("VmRSS")
        return self

    def stop(self) -> int | None:
        peak = _kib("VmHWM")
        if self.base is not None and peak is not None:
            self.rise = max(0, peak - self.base)
        return self.rise

    def __enter__(self) -> PeakRSS:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def extra_at_peak(probe: PeakRSS, held: list, alive: list, device: str) -> int | None:
    """Host memory a sync held at its peak: the reusable pools resident before it (`held`, counted if still in
    use: `alive`) + how far the resident size rose until `probe` stops. Pools the sync allocated itself are in
    the rise (first touched while packing). None on GPU (its buffers are device memory) or without /proc."""
    rise = probe.stop()
    if rise is None or device != "cpu":
        return None
    return rise + sum(p.allocated_bytes for p in held if any(p is q for q in alive))
