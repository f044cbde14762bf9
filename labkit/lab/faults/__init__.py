"""`labkit faults`: the fault plan (pure) and the harness that runs each trial on a real Workbench."""
