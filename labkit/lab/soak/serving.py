"""What the soak's HTTP engine serves while it is synced: labkit's own client threads (greedy requests whose every
token is checked against its weight version's greedy output, labkit.lab.bench.serve) and an OpenAI client
(`openai`, the completions and chat endpoints a user's tools call) on the same server.

Between syncs the load is quieted (no request in flight) so the driver can take the new version's reference
outputs on an idle engine and check what was answered. Only counts are kept from one sync to the next: a soak that
kept every response would grow the driver's memory by itself and read as a leak.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from types import SimpleNamespace

from labkit.lab.bench.load import Clients
from labkit.lab.bench.serve import OUTCOMES, _check
from labkit.models.tokenizer import EOS, decode

KEEP_VERSIONS = 4  # references kept: the served version and the few before it
# Seconds the OpenAI client keeps an idle connection for its next request. SGLang's server closes one idle for 5 s
# (SGLANG_TIMEOUT_KEEP_ALIVE), the same as httpx's default expiry: a request sent on a connection the server is
# closing at that moment is lost as `APIConnectionError: Connection error.` (1 of 1,430 in
# data/soak_grpc_threads4_cpu.json; the load idles for seconds between syncs). Expiring first on the client's side
# leaves no such moment.
KEEPALIVE_S = 2.0


class OpenAIClient(threading.Thread):
    """Alternates /v1/completions and /v1/chat/completions (greedy) while `go` is set. A response that neither
    started nor ended inside a sync is checked against the greedy text of the version served then; one that
    overlapped a sync is counted as answered only (a retracted request continues under the new weights, and the
    OpenAI response does not say where)."""

    def __init__(self, url: str, texts: list[str], max_tokens: int, timeout_s: float):
        super().__init__(daemon=True)
        import httpx
        import openai

        # no retries: a request the server drops is counted as failed, not sent again
        http = httpx.Client(limits=httpx.Limits(max_connections=4, keepalive_expiry=KEEPALIVE_S), timeout=timeout_s)
        self.client = openai.OpenAI(base_url=url + "/v1", api_key="unused", timeout=timeout_s, max_retries=0,
                                    http_client=http)
        self.texts, self.max_tokens = texts, max_tokens
        self.go, self.stop, self.idle = threading.Event(), threading.Event(), threading.Event()
        self.idle.set()
        self.rows: list[dict] = []
        self.lock = threading.Lock()
        self.counts = Counter()

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            if not self.go.wait(timeout=0.2):
                continue
            self.idle.clear()
            p, chat, t0 = i % len(self.texts), i % 2 == 1, time.monotonic()
            try:
                text = self._ask(self.texts[p], chat)
                row = {"prompt": p, "endpoint": "chat" if chat else "completions", "text": text}
            except Exception as e:  # noqa: BLE001 - every failure is counted, and its kind kept
                row = {"prompt": p, "endpoint": "chat" if chat else "completions",
                       "error": f"{type(e).__name__}: {e}"[:200]}
            row.update(t0=t0, t1=time.monotonic())
            with self.lock:
                self.rows.append(row)
            self.idle.set()
            i += 1
            time.sleep(0.1)  # a steady stream, not a flood: the box has two cores

    def _ask(self, text: str, chat: bool) -> str:
        greedy = {"model": "served", "max_tokens": self.max_tokens, "temperature": 0.0}
        if chat:
            out = self.client.chat.completions.create(messages=[{"role": "user", "content": text}], **greedy)
            return out.choices[0].message.content
        return self.client.completions.create(prompt=text, **greedy).choices[0].text

    def quiet(self, timeout_s: float) -> None:
        self.go.clear()
        self.idle.wait(timeout_s)

    def answer_after(self, t: float, timeout_s: float) -> None:
        """Wait (bounded) until a request sent after `t` has been answered: one that overlapped no sync, so it is
        checked against the greedy text of the version served (most requests overlap one on a box this busy)."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            with self.lock:
                if any(r["t0"] >= t for r in self.rows):
                    return
            time.sleep(0.01)

    def fold(self, window: tuple[float, float], before: dict, after: dict) -> None:
        """Count the rows finished since the last fold (all started after it): one that ended before the sync
        `window` is checked against `before` (the greedy texts of the version served until the sync), one that
        started after it against `after` (the version served since)."""
        with self.lock:
            rows, self.rows = self.rows, []
        a, b = window
        for r in rows:
            self.counts["sent"] += 1
            if "error" in r:
                self.counts["failed"] += 1
                self.counts["error:" + r["error"][:80]] += 1
                continue
            self.counts[f"ok/{r['endpoint']}"] += 1
            want = before if r["t1"] <= a else after if r["t0"] >= b else None
            if want is None:
                self.counts["overlapped_sync"] += 1
            elif r["text"] == want[r["prompt"]]:
                self.counts["checked"] += 1
            else:
                self.counts["mismatched"] += 1


class Load:
    """labkit's clients and the OpenAI client against one HTTP engine: they stream from `open` (before a sync)
    to `settle` (after it), so every sync runs under requests."""

    def __init__(self, engine, prompts: list[list[int]], cfg):
        # A request may wait out a whole failed sync and its restore (paused, never refused): the clients' bound
        # is a few sync deadlines, not one engine call's.
        wait_s = cfg.deadline_s * 4
        args = SimpleNamespace(clients=cfg.clients, max_requests=2**62, max_seconds=cfg.minutes * 60 + 3600,
                               max_new_tokens=cfg.max_new_tokens, timeout_s=wait_s)
        # the references and the checks wait as long as a request may (the engine answers slowly while the other
        # one restarts beside it on the same cores)
        self.engine, self.prompts, self.cfg, self.args = engine.portable(call_timeout_s=wait_s), prompts, cfg, args
        self.clients = Clients(engine, prompts, args)
        self.openai = OpenAIClient(engine.url, [decode(p) for p in prompts], cfg.max_new_tokens, wait_s)
        self.refs: dict[str, dict[int, list[int]]] = {}  # version -> prompt -> greedy tokens (ignore_eos)
        self.texts: dict[str, dict[int, str]] = {}  # version -> prompt -> greedy text (as the OpenAI API stops)
        self.outcomes, self.errors, self.changed = Counter(), Counter(), []
        self._reference()
        for t in [*self.clients.threads, self.openai]:
            t.start()

    def open(self) -> None:
        """Let the clients stream (until `settle`), and wait (bounded) until a request is in flight."""
        self.clients.open(2**62)
        self.openai.go.set()
        self.clients.wait_in_flight()

    def settle(self, window: tuple[float, float]) -> int:
        """After a sync: quiet the load, take the version now served's references, count what was answered.
        Returns how many labkit requests were in flight during the sync `window`."""
        self.openai.answer_after(window[1], self.args.timeout_s)
        self.clients.drain()
        self.openai.quiet(self.args.timeout_s)
        before = self.version
        self._reference()
        with self.clients.lock:
            rows, self.clients.rows = self.clients.rows, []
        _check(rows, self.prompts, self.refs, self.engine, self.args)
        self.outcomes.update(r["outcome"] for r in rows)
        self.errors.update(r["error"][:120] for r in rows if "error" in r)
        self.openai.fold(window, self.texts[before], self.texts[self.version])
        return sum(r["t0"] < window[1] and r["t1"] > window[0] for r in rows)

    def _reference(self) -> None:
        """The served version's greedy outputs, taken once per version on the idle engine."""
        last = self.refs.get(getattr(self, "version", None))
        self.version = self.engine.weight_version
        if self.version not in self.refs:
            self.refs[self.version] = dict(enumerate(self._greedy()))
            if last is not None:  # prompts whose greedy output this version changed: a mixed answer shows there
                self.changed.append(sum(last[p] != t for p, t in self.refs[self.version].items()))
            # what an OpenAI client gets: the same greedy tokens, stopped at the first EOS
            self.texts[self.version] = {p: decode(t[:t.index(EOS)] if EOS in t else t)
                                        for p, t in self.refs[self.version].items()}
        for old in list(self.refs)[:-KEEP_VERSIONS]:  # a restore brings back the version before, not older ones
            self.refs.pop(old)
            self.texts.pop(old)

    def _greedy(self) -> list[list[int]]:
        sampling = {"temperature": 0.0, "max_new_tokens": self.cfg.max_new_tokens, "ignore_eos": True}
        return [o["tokens"] for o in self.engine.generate(input_ids=self.prompts, sampling=sampling)]

    def counts(self) -> dict:
        return {"labkit": {o: self.outcomes.get(o, 0) for o in (*OUTCOMES, "failed")},
                "labkit_errors": dict(self.errors), "openai": dict(self.openai.counts),
                "prompts_changed": list(self.changed)}

    def close(self) -> None:
        self.clients.close()
        self.openai.stop.set()
        self.openai.go.set()
        self.openai.join(timeout=self.cfg.timeout_s * 3)
        self.openai.client.close()
