"""What serves notebooks, the CLI and scripts on top of the library's data path: the Workbench object, the
main job (demo), benchmarks (sync, serve-sync), fault injection, the notebook runner, figures and widgets.
Nothing below this package imports it.

`Workbench` and `Rollout` are loaded on first use (PEP 562): importing a light module of this package (a config,
the CLI's flag list) must not start torch, Ray and the trainer (`labkit --help` stays fast)."""

__all__ = ["Rollout", "Workbench"]


def __getattr__(name: str):
    if name in __all__:
        from labkit.workbench import core

        return getattr(core, name)
    raise AttributeError(f"module 'labkit.workbench' has no attribute {name!r}")
