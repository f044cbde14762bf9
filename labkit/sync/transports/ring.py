"""The trainer side of a colocated sync in one engine call (labkit.engine.inside.ring says why)."""

from __future__ import annotations

import shutil
import socket
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from labkit import pids
from labkit.engine.inside import ring
from labkit.engine.config import APPLY_FORMAT
from labkit.engine.errors import EngineError, EngineUnreachable

ACCEPT_POLL_S = 0.05  # how often the wait for the engine's connection looks at the call (did it fail first?)
ABORT_WAIT_S = 10.0  # after giving up, how long the call may take to end (it sees the socket close at once)
PREFIX = "labkit_ring_"  # + `pids.owner_tag()` + "-": whose directory it is, for `sweep_dead`
_swept = False


class Ring:
    """One open `update_weights_from_tensor` for the whole sync, fed bucket by bucket over a Unix socket.

    Flow:
    1. start: listen on `labkit_ring_pid-<pid namespace>.<pid>-*/ring.sock` (`pids.owner_tag`: a fresh private
       directory; those of dead trainers are removed first, `sweep_dead`), send the call (on its own thread: it returns
       when the sync's last bucket is applied) naming the socket and the bucket count, wait for the engine to connect;
    2. send, per bucket: the payload its own call would have carried (serialized bytes), then wait for the engine's byte
       that says it is applied (the bucket's buffer is free again);
    3. finish: take the call's answer. Or abort, after a failure: close the socket (the engine ends its call at once,
       without an error: labkit.engine.inside.ring says why), give the call a few seconds to answer, never raising.
    A wait past `timeout_s` raises EngineUnreachable, as a per-bucket call past its timeout does; a closed stream raises
    the engine's own error when its call carried one.
    """

    def __init__(self, engine, serializer, buckets: int, timeout_s: float):
        self.timeout_s, self.buckets, self.acked = timeout_s, buckets, 0
        sweep_dead()
        self.dir = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{pids.owner_tag()}-"))  # 0700: only this user connects
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.conn: socket.socket | None = None
        self.call: Future | None = None
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="labkit-ring")
        try:
            path = str(self.dir / ring.SOCKET)
            self.listener.bind(path)
            self.listener.listen(1)
            named = [(ring.key(path, buckets, timeout_s), torch.zeros(1, dtype=torch.uint8))]
            self.call = self.thread.submit(engine.update_weights_from_tensor,
                                           [serializer.serialize(named, output_str=True)],
                                           load_format=APPLY_FORMAT, flush_cache=False)
            self.conn = self._accept()
        except BaseException:
            self.abort()
            raise

    def _accept(self) -> socket.socket:
        self.listener.settimeout(ACCEPT_POLL_S)
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                conn, _ = self.listener.accept()
                conn.settimeout(self.timeout_s)
                return conn
            except socket.timeout:
                if self.call.done():
                    self.call.result()  # the engine's own error, if it refused the call
                    raise EngineError("labkit ring: the engine answered the sync's call without connecting")
                if time.monotonic() > deadline:
                    raise EngineUnreachable(f"labkit ring: the engine did not connect within {self.timeout_s:.0f} s")

    def send(self, payload: bytes) -> float:
        """Send one bucket's serialized payload and wait until the engine applied it. Returns the seconds spent
        sending; the rest of the wait is the engine's apply."""
        t0, err = time.perf_counter(), None
        try:
            ring.send_bucket(self.conn, payload)
            sent = time.perf_counter() - t0
            got = self.conn.recv(1)
        except socket.timeout:
            raise EngineUnreachable(f"labkit ring: bucket {self.acked} was not applied within "
                                    f"{self.timeout_s:.0f} s") from None
        except OSError as e:
            got, err = b"", e
        if got != ring.ACK:
            self._raise_engine_error(err)
        self.acked += 1
        return sent

    def _raise_engine_error(self, err: BaseException | None) -> None:
        try:
            self.call.result(timeout=ABORT_WAIT_S)  # the engine closed the stream: its call's error says why
        except TimeoutError:
            pass
        raise EngineError(f"labkit ring: the engine stopped after {self.acked} of {self.buckets} buckets"
                          + (f" ({err})" if err else ""))

    def finish(self) -> None:
        try:
            self.call.result(timeout=self.timeout_s)
        finally:
            self._close()

    def abort(self) -> None:
        if self.conn is not None:
            self.conn.close()  # the engine's next read ends: it fails the call instead of waiting it out
        try:
            if self.call is not None:
                self.call.result(timeout=ABORT_WAIT_S)
        except Exception:
            pass
        self._close()

    def _close(self) -> None:
        for s in (self.conn, self.listener):
            if s is not None:
                s.close()
        self.thread.shutdown(wait=False)
        shutil.rmtree(self.dir, ignore_errors=True)


def sweep_dead(root: str | None = None, force: bool = False) -> list[str]:
    """Remove this user's ring directories whose trainer process is gone (once per process unless `force`): a
    SIGKILLed trainer never reaches `_close`, and its empty `labkit_ring_*` directory stayed in the temp
    directory for good. Only directories made in this process's pid namespace are judged: a trainer in another
    container sharing the temp directory has pids this one cannot see. Returns the directories removed."""
    global _swept
    if _swept and not force:
        return []
    _swept = True
    gone = pids.dead(root or tempfile.gettempdir(), PREFIX)
    for d in gone:
        shutil.rmtree(d, ignore_errors=True)
    return [str(d) for d in gone]
