"""The soak's OpenAI client lets an idle connection go before SGLang's server does: a request sent on a connection
the server is closing at that moment is lost (`APIConnectionError: Connection error.`), and the soak's load idles
for seconds between syncs."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from labkit.lab.soak import serving


class _Completions(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn serves
    peers: set = set()

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["Content-Length"]))
        self.peers.add(self.client_address)  # one (host, port) per connection the client opened
        body = json.dumps({"id": "x", "object": "text_completion", "created": 0, "model": "served",
                           "choices": [{"index": 0, "text": "ok", "finish_reason": "length", "logprobs": None}]})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


def test_an_idle_connection_is_dropped_by_the_client_before_the_server_closes_it(monkeypatch):
    from sglang.srt.environ import envs

    assert serving.KEEPALIVE_S < envs.SGLANG_TIMEOUT_KEEP_ALIVE.get()  # the server's bound, read from SGLang
    monkeypatch.setattr(serving, "KEEPALIVE_S", 0.3)  # the same rule, scaled down so the test is short
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Completions)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = serving.OpenAIClient(f"http://127.0.0.1:{server.server_port}", ["a"], 2, 5.0)
    try:
        assert client._ask("a", chat=False) == "ok"
        assert client._ask("a", chat=False) == "ok"
        assert len(_Completions.peers) == 1  # back to back: the kept connection is reused
        time.sleep(0.6)
        assert client._ask("a", chat=False) == "ok"
        assert len(_Completions.peers) == 2  # idle past KEEPALIVE_S: a new connection, not one being closed
    finally:
        client.client.close()
        server.shutdown()
        server.server_close()
