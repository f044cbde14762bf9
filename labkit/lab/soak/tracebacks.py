"""A caught exception kept past its `except` block, without the frames it was raised through.

`except E as e` deletes `e` at the block's end because the exception's traceback holds the frame that caught it:
kept in a local of that frame (`err = e`), it makes a cycle (frame -> err -> traceback -> frame) that only the
garbage collector frees, and with it every frame the error was raised through and their locals (a failed sync's
buckets, its engines' replies). In a long-lived process those frames are old by the time they are garbage, so
they wait for a full collection, which a process holding millions of objects (torch, SGLang, Megatron imported)
runs seldom: the soak's driver held ~3 MB from a failed sync at 215 until a later collection, through the 150
syncs between (data/soak_cpu.json at e6c14a3: its private memory after every fault's trim, 510.2 to 511.9 MB up
to sync 206, 514.2 to 516.4 from 215 to 359, 512.9 at 368).
"""

from __future__ import annotations


def without_traceback(e: BaseException) -> BaseException:
    """`e`, and every exception it chains (`__cause__`, `__context__`), with its traceback dropped; the type and
    message stay, which is all a caller that only records or reports the error reads."""
    seen, todo = set(), [e]
    while todo:
        x = todo.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        x.__traceback__ = None
        todo += [x.__cause__, x.__context__]
    return e
