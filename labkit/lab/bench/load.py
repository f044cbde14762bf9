"""A steady stream of greedy requests against an engine, from client threads, each row timed: the serving load
that `labkit bench serve-sync` runs syncs under (labkit.lab.bench.serve)."""

from __future__ import annotations

import threading
import time


class Clients:
    """Client threads: greedy requests in a loop while `go` is set; each row records its times and answer."""
    def __init__(self, engine, prompts: list[list[int]], cfg):
        """`cfg`: a ServeBenchConfig (clients, max_requests, max_seconds, max_new_tokens, timeout_s)."""
        self.engine, self.prompts, self.cfg = engine.portable(call_timeout_s=cfg.timeout_s), prompts, cfg
        self.go, self.stop, self.lock = threading.Event(), threading.Event(), threading.Lock()
        self.rows, self.in_flight, self.sent, self.quota = [], 0, 0, 0
        self.deadline = time.monotonic() + cfg.max_seconds
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(cfg.clients)]

    def _take(self) -> int | None:
        with self.lock:
            if self.stop.is_set() or self.sent >= self.quota or time.monotonic() > self.deadline:
                return None
            self.sent += 1
            self.in_flight += 1
            return self.sent - 1

    def _loop(self) -> None:
        sampling = {"temperature": 0.0, "max_new_tokens": self.cfg.max_new_tokens, "ignore_eos": True}
        while not self.stop.is_set() and time.monotonic() < self.deadline:
            if not self.go.wait(timeout=0.2):
                continue
            i = self._take()
            if i is None:
                if self.stop.is_set() or time.monotonic() > self.deadline:
                    return
                time.sleep(0.02)  # this sync's share is spent: wait for the next one
                continue
            p, t0, row = i % len(self.prompts), time.monotonic(), None
            try:
                out = self.engine.generate(input_ids=[self.prompts[i % len(self.prompts)]], sampling=sampling)[0]
                row = {"prompt": p, "tokens": out["tokens"], "meta": out["meta_info"]}
            except Exception as e:  # noqa: BLE001 - every failure is a row ("failed")
                row = {"prompt": p, "error": f"{type(e).__name__}: {e}"[:300]}
            row.update(t0=t0, t1=time.monotonic())
            with self.lock:
                self.rows.append(row)
                self.in_flight -= 1

    def open(self, n: int) -> None:
        """Let `n` more requests go (one sync's share of max_requests)."""
        with self.lock:
            self.quota = self.sent + n
        self.go.set()

    def wait_in_flight(self) -> bool:
        """Bounded wait until a request is in flight, so the sync that follows overlaps one by construction
        (otherwise the stream's whole budget can be spent before the sync starts, and nothing is tested)."""
        end = time.monotonic() + self.cfg.timeout_s
        while not self.in_flight and time.monotonic() < end:
            time.sleep(0.005)
        return self.in_flight > 0

    def drain(self) -> None:
        """Stop sending; wait (bounded) until no request is in flight."""
        self.go.clear()
        end = time.monotonic() + self.cfg.timeout_s
        while self.in_flight and time.monotonic() < end:
            time.sleep(0.02)

    def close(self) -> None:
        self.stop.set()
        self.go.set()
        for t in self.threads:
            t.join(timeout=self.cfg.timeout_s)
