"""Benchmarks of the data path, each a `labkit bench <name>` (JSON out, a correctness check that can fail)."""
