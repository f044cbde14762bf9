"""The lab: what measures, reports and experiments on the library, apart from the data path.

`bench` (sync, delta, codec, serve-while-syncing and its load), `device` (the GPU data-path check), `faults`
(the fault plan and its harness), `roofline` (bounds from config.json alone, overheads fitted on stored runs,
published systems), `report` (the generated tables of README and docs/), `pretrain` (the shipped tiny model).
Everything here uses the library (labkit.sync, labkit.engine, labkit.trainer, labkit.workbench); nothing on the
data path imports it (tests/unit/test_layers.py).
"""
