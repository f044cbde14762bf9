"""What serves notebooks, the CLI and scripts on top of the library's data path: the Workbench object, the
main job (demo), benchmarks (sync, serve-sync), fault injection, the notebook runner, figures and widgets.
Nothing below this package imports it."""

from labkit.workbench.core import Rollout, Workbench

__all__ = ["Rollout", "Workbench"]
