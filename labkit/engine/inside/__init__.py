"""Code that runs inside SGLang's scheduler process, not in the driver.

SGLang imports these modules in its own scheduler: `apply.load_flat` as the custom weight loader named at launch,
`sglang_models` as the external model package. Each transport's engine half is named after the transport it
serves (labkit.sync.transports.<name> sends, labkit.engine.inside.<name> receives): `colocated` (a bucket in the
atomic guard's staging file), `ring` (a whole sync in one engine call), `direct` (the engine's parameters shared
with the trainer), `delta` (the codec both sides of a delta sync use). `copyplan` and `copyruns` compile where
each tensor lands; `checkmemo` remembers checksum replies until a request may write weights.

The driver side of the engine (labkit.engine: handle, backend, actor, http, lifecycle, loader, config) talks to
this process only through SGLang's calls; nothing here imports Ray.
"""
