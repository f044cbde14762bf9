"""`labkit bench device`: the GPU data path on a real accelerator, with an engine stand-in (marked in its output)."""
