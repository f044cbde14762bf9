"""Leak and drift checks for long runs: `trend` (a quantity's slope over syncs with its 95 % interval, and the
no-upward-trend verdict), `resources` (what every process of a run holds, /dev/shm, Ray's object store)."""
