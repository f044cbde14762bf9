"""glibc malloc settings for the processes labkit starts, so memory a sync frees goes back to the system.

Why: glibc serves a block above its mmap threshold with mmap and returns it on free, but the threshold is dynamic:
freeing such a block raises it to that block's size (up to 32 MiB). After the first freed bucket, every buffer of
a sync (buckets, packed copies, checksums, a transport's staging) comes from the heap instead, and a heap whose top
holds one small live block cannot shrink below it: resident memory climbs sync after sync with nothing live behind
it, and a soak reads each process's climb as a leak (`labkit soak`, docs/soak.md; `retained_mb` below reproduces
it). A fixed threshold keeps large buffers mmapped, a fixed trim threshold hands the heap's free top back, and two
arenas bound the per-thread heaps of a process whose threads allocate (SGLang's scheduler, Ray's core worker, gloo).

Where it applies: `install` sets `GLIBC_TUNABLES` in this process's environment (read by every process started
from it: a local Ray cluster's raylet, GCS and workers, SGLang's server, scheduler and detokenizer) and applies the
same settings to this already-running process with `mallopt`. An explicit `GLIBC_TUNABLES` wins, and
`LABKIT_MALLOC=default` leaves glibc's defaults everywhere. A process not on glibc is left alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

ENV = "GLIBC_TUNABLES"
OPT_OUT = "LABKIT_MALLOC"  # "default": glibc's own settings
# glibc's own starting thresholds (128 KiB), held there: only the ratchet goes, not the sizes mmap serves
SETTINGS = (("mmap_threshold", 128 * 1024), ("trim_threshold", 128 * 1024), ("arena_max", 2))
_MALLOPT = {"mmap_threshold": -3, "trim_threshold": -1, "arena_max": -8}  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, ...


def tunables() -> str:
    """The `GLIBC_TUNABLES` value of SETTINGS."""
    return ":".join(f"glibc.malloc.{k}={v}" for k, v in SETTINGS)


def wanted(environ=os.environ) -> bool:
    return environ.get(OPT_OUT, "").strip().lower() != "default"


def install(environ=os.environ) -> bool:
    """SETTINGS for the processes started from here (environment) and for this one (mallopt). Returns whether this
    process now runs with them (False: opted out, an explicit GLIBC_TUNABLES, or not glibc)."""
    if not wanted(environ) or environ.get(ENV, tunables()) != tunables():
        return False
    environ[ENV] = tunables()
    return tune_this_process()


def tune_this_process() -> bool:
    """mallopt(SETTINGS) in this process; False where there is no glibc malloc."""
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
    except (OSError, AttributeError, TypeError):  # no libc found, or one without mallopt (not glibc)
        return False
    return all(mallopt(_MALLOPT[k], v) == 1 for k, v in SETTINGS)


def trim() -> bool:
    """Hand the free pages of every heap back to the system (glibc's malloc_trim(0), which since 2.8 releases free
    pages inside an arena too, not only at its top). For a long-lived process after a burst of small allocations
    made while other threads allocate in the same arenas: what the burst freed sits between live blocks, and RSS
    keeps it though nothing holds it. `labkit soak` calls it in the driver after each acceptance measurement (its
    own instrument builds two models there) and after each fault (its harness's threads, proofs and a failed sync's
    traceback: data/soak_cpu.json at bcf5e06, the driver's private memory up 1.3 to 2.3 MB at 10 of 36 faults and
    back at the next measurement's trim), so the driver's slope is the library's, not the instrument's."""
    try:
        return bool(ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0))
    except (OSError, AttributeError, TypeError):  # no glibc
        return False


def retained_mb(rounds: int = 3, blocks: int = 100) -> float:
    """Resident MB left after freeing `rounds` x `blocks` 1 MiB buffers, each followed by a small live one (a sync's
    buffers beside its long-lived records), after one freed 2 MiB block raised the dynamic threshold: about `blocks`
    MB under glibc's defaults (the heap's high-water mark: each round reuses what the last one freed, so a process
    steps up whenever a sync needs more than any before it), about none under SETTINGS."""

    def rss() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    base = rss()
    big = bytearray(2 << 20)
    del big
    keep = []
    for _ in range(rounds):
        buffers = []
        for _ in range(blocks):
            buffers.append(bytearray(1 << 20))
            keep.append(bytearray(2000))
        del buffers
    return rss() - base
