"""A failed sync's error kept past its `except` must not keep the frames it was raised through: kept with its
traceback in a local of the catching frame, it makes a cycle that only a full garbage collection frees, and the
failed sync's buffers stay resident until then (labkit.lab.soak.tracebacks)."""

import gc
import weakref

from labkit.lab.soak.tracebacks import without_traceback


class Buffer:  # a bucket held in a local of a frame the error went through
    pass


def _sync(held: list):
    buf = Buffer()
    held.append(weakref.ref(buf))
    try:
        raise OSError("peer gone")
    except OSError as inner:
        raise RuntimeError("sync failed") from inner


def _step(keep) -> tuple[weakref.ref, BaseException]:
    held: list = []
    try:
        _sync(held)
    except RuntimeError as e:
        err = keep(e)  # as the soak's step keeps it
    return held[0], err


def test_an_error_kept_without_its_traceback_frees_the_failed_frames_at_once():
    gc.disable()
    try:
        kept, err = _step(lambda e: e)
        assert kept() is not None  # with its traceback: the buffer waits for the collector
        gc.collect()
        ref, err = _step(without_traceback)
        assert ref() is None  # freed when the frames ended, no collector needed
        assert str(err) == "sync failed" and str(err.__cause__) == "peer gone" and err.__traceback__ is None
    finally:
        gc.enable()
