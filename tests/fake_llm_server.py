"""A local fake LLM server speaking the Anthropic Messages and OpenAI Chat
Completions wire formats, for driving the real SDK clients in tests.

It binds 127.0.0.1 on a random port, serves from a daemon thread, answers at
most `max_requests` requests and shuts itself down after `lifetime_s` seconds
even if a test forgets to stop it.  Each request takes the next `Reply` of the
script (then `default`); every request is recorded for assertions.

    with FakeLLMServer([Reply.error(429, retry_after="2"), Reply.answer("hi")]) as srv:
        client = anthropic.Anthropic(base_url=srv.url, api_key="k", max_retries=0)
        ...
        assert len(srv.requests) == 2

`Reply.answer(text)` adapts to the request: /v1/messages gets an Anthropic
Message, /v1/chat/completions a ChatCompletion, and a request with
"stream": true gets the matching server-sent events.

Run by hand: `python tests/fake_llm_server.py --answer-file ANSWER.md` prints
the base URL and answers every request with that file's text.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@dataclass
class Reply:
    status: int = 200
    body: object = None  # dict -> JSON; bytes/str sent as is; None with answer_text -> built per format
    headers: dict = field(default_factory=dict)
    delay_s: float = 0.0  # sleep before answering (for timeout tests)
    answer_text: str | None = None  # format-agnostic answer
    usage: tuple[int, int] = (100, 50)  # (input_tokens, output_tokens) reported with an answer
    stream: bool | None = None  # None: follow the request's "stream"; True/False force it
    stream_error: bool = False  # stream: send the text, then an error event and stop
    content_type: str | None = None

    @classmethod
    def answer(cls, text: str, usage: tuple[int, int] = (100, 50), **kw) -> "Reply":
        return cls(answer_text=text, usage=usage, **kw)

    @classmethod
    def error(cls, status: int, message: str = "fake error", retry_after: str | None = None, **kw) -> "Reply":
        headers = dict(kw.pop("headers", {}))
        if retry_after is not None:
            headers["Retry-After"] = retry_after
        body = {"type": "error", "error": {"type": _ERROR_TYPES.get(status, "api_error"), "message": message}}
        return cls(status=status, body=body, headers=headers, **kw)

    @classmethod
    def malformed(cls, raw: bytes = b'{"id": "msg_1", "content": [{"type": "te', **kw) -> "Reply":
        return cls(status=200, body=raw, content_type="application/json", **kw)


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict
    body: object  # parsed JSON, or the raw text when not JSON
    time: float


# -- wire formats ------------------------------------------------------------

def anthropic_message(text: str, model: str, usage=(100, 50)) -> dict:
    return {
        "id": "msg_fake_1",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
    }


def openai_completion(text: str, model: str, usage=(100, 50)) -> dict:
    return {
        "id": "chatcmpl-fake-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop", "logprobs": None}
        ],
        "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": usage[0] + usage[1]},
    }


def _chunks(text: str, n: int = 3) -> list[str]:
    size = max(1, -(-len(text) // n))
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def anthropic_sse(text: str, model: str, usage=(100, 50), error: bool = False) -> list[tuple[str, dict]]:
    msg = anthropic_message("", model, (usage[0], 1))
    msg["content"] = []
    msg["stop_reason"] = None
    events = [("message_start", {"type": "message_start", "message": msg})]
    events.append(("content_block_start", {"type": "content_block_start", "index": 0,
                                           "content_block": {"type": "text", "text": ""}}))
    events.append(("ping", {"type": "ping"}))
    for part in _chunks(text):
        events.append(("content_block_delta", {"type": "content_block_delta", "index": 0,
                                               "delta": {"type": "text_delta", "text": part}}))
    if error:
        events.append(("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}))
        return events
    events.append(("content_block_stop", {"type": "content_block_stop", "index": 0}))
    events.append(("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                     "usage": {"output_tokens": usage[1]}}))
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def openai_sse(text: str, model: str, usage=(100, 50), include_usage: bool = True) -> list[tuple[str | None, dict | str]]:
    base = {"id": "chatcmpl-fake-1", "object": "chat.completion.chunk", "created": 1700000000, "model": model}
    events: list = [(None, {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                 "finish_reason": None}]})]
    for part in _chunks(text):
        events.append((None, {**base, "choices": [{"index": 0, "delta": {"content": part}, "finish_reason": None}]}))
    events.append((None, {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    if include_usage:
        events.append((None, {**base, "choices": [], "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1],
                                                               "total_tokens": usage[0] + usage[1]}}))
    events.append((None, "[DONE]"))
    return events


# -- the server ----------------------------------------------------------------

class FakeLLMServer:
    def __init__(self, script: list[Reply] | None = None, default: Reply | None = None,
                 max_requests: int = 200, lifetime_s: float = 120.0, model_id: str = "fake-local-model"):
        self.script = list(script or [])
        self.model_id = model_id
        self.default = default
        self.max_requests = max_requests
        self.lifetime_s = lifetime_s
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._timer: threading.Timer | None = None

    # lifecycle
    def start(self) -> "FakeLLMServer":
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                server._handle(self)

            def do_GET(self):
                server._handle(self)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-llm", daemon=True)
        self._thread.start()
        self._timer = threading.Timer(self.lifetime_s, self.stop)
        self._timer.daemon = True
        self._timer.start()
        return self

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if self._timer is not None and self._timer is not threading.current_thread():
            self._timer.cancel()
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()

    def __enter__(self) -> "FakeLLMServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not running"
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        """Base URL for the Anthropic SDK (it appends /v1/messages)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_url(self) -> str:
        """Base URL for the OpenAI SDK (it appends /chat/completions)."""
        return f"http://127.0.0.1:{self.port}/v1"

    # one request
    def _next_reply(self) -> Reply | None:
        with self._lock:
            if len(self.requests) > self.max_requests:
                return None
            if self.script:
                return self.script.pop(0)
            return self.default

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        if h.command == "GET" and h.path.rstrip("/").endswith("/models"):
            # model discovery (not a scripted reply): what local OpenAI-compatible servers answer
            self._send(h, 200, {"object": "list", "data": [{"id": self.model_id, "object": "model",
                                                            "created": 0, "owned_by": "fake"}]})
            return
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        with self._lock:
            self.requests.append(RecordedRequest(h.command, h.path, dict(h.headers.items()), body, time.monotonic()))
        reply = self._next_reply()
        if reply is None:
            self._send(h, 503, {"error": {"type": "api_error", "message": "fake server: no reply scripted"}})
            return
        if reply.delay_s:
            time.sleep(reply.delay_s)
        is_anthropic = h.path.rstrip("/").endswith("/messages")
        model = body.get("model", "fake-model") if isinstance(body, dict) else "fake-model"
        if reply.answer_text is not None and reply.status == 200:
            stream = reply.stream if reply.stream is not None else bool(isinstance(body, dict) and body.get("stream"))
            if stream:
                if is_anthropic:
                    events = anthropic_sse(reply.answer_text, model, reply.usage, error=reply.stream_error)
                else:
                    include = bool(isinstance(body, dict) and (body.get("stream_options") or {}).get("include_usage"))
                    events = openai_sse(reply.answer_text, model, reply.usage, include_usage=include)
                self._send_sse(h, events, reply.headers)
                return
            payload = (anthropic_message if is_anthropic else openai_completion)(reply.answer_text, model, reply.usage)
            self._send(h, 200, payload, reply.headers)
            return
        self._send(h, reply.status, reply.body if reply.body is not None else {}, reply.headers, reply.content_type)

    def _send(self, h, status: int, body, headers: dict | None = None, content_type: str | None = None) -> None:
        if isinstance(body, (dict, list)):
            data = json.dumps(body).encode()
            content_type = content_type or "application/json"
        else:
            data = body.encode() if isinstance(body, str) else bytes(body)
            content_type = content_type or "text/plain"
        try:
            h.send_response(status)
            h.send_header("Content-Type", content_type)
            h.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(data)
            h.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (timeout test)

    def _send_sse(self, h, events, headers: dict | None = None) -> None:
        try:
            h.send_response(200)
            h.send_header("Content-Type", "text/event-stream")
            h.send_header("Cache-Control", "no-cache")
            h.send_header("Connection", "close")
            for k, v in (headers or {}).items():
                h.send_header(k, v)
            h.end_headers()
            for name, data in events:
                payload = data if isinstance(data, str) else json.dumps(data)
                chunk = (f"event: {name}\n" if name else "") + f"data: {payload}\n\n"
                h.wfile.write(chunk.encode())
                h.wfile.flush()
            h.close_connection = True
        except (BrokenPipeError, ConnectionResetError):
            pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--answer-file", type=Path, required=True)
    ap.add_argument("--lifetime", type=float, default=600.0)
    args = ap.parse_args()
    srv = FakeLLMServer(default=Reply.answer(args.answer_file.read_text()), lifetime_s=args.lifetime).start()
    print(f"anthropic base_url: {srv.url}\nopenai base_url:    {srv.openai_url}", flush=True)
    try:
        while srv._httpd is not None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        srv.stop()


if __name__ == "__main__":
    main()
