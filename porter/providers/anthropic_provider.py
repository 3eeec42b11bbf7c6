"""The `anthropic` provider: the Messages API through the official SDK.

The key comes from ANTHROPIC_API_KEY only.  The SDK's own retries are 0;
porter.providers.retry decides (see porter.providers.common for settings).
With stream = true the answer is read as server-sent events and the text
deltas are joined; usage comes from message_start / message_delta.
"""

from __future__ import annotations

import anthropic

from porter.providers.common import HttpProvider, malformed
from porter.providers.retry import Retryable


class AnthropicProvider(HttpProvider):
    name = "anthropic"
    key_envs = ("ANTHROPIC_API_KEY",)
    sdk_client = anthropic.Anthropic

    def _request(self, req, max_tokens: int) -> dict:
        kwargs = dict(model=self.model, max_tokens=max_tokens, messages=[{"role": "user", "content": req.prompt}])
        if getattr(req, "system", None):
            kwargs["system"] = req.system
        return kwargs

    def _call(self, req, max_tokens):
        kwargs = self._request(req, max_tokens)
        if self.stream:
            return self._call_stream(kwargs)
        try:
            msg = self.client.messages.create(**kwargs)
        except Exception as exc:  # noqa: BLE001 - classify() re-raises what it does not know
            raise self.classify(exc, anthropic) from None
        if not isinstance(msg, anthropic.types.Message):
            raise malformed(f"expected a JSON Message, got {type(msg).__name__}")
        usage = None
        if msg.usage is not None:
            usage = {"input_tokens": msg.usage.input_tokens, "output_tokens": msg.usage.output_tokens}
        if not isinstance(msg.content, list) or msg.type not in (None, "message"):
            raise malformed("no content list in the Message", usage)
        return "".join(getattr(b, "text", "") or "" for b in msg.content if getattr(b, "type", None) == "text"), usage

    def _call_stream(self, kwargs):
        parts: list[str] = []
        usage: dict = {}
        saw_stop = False
        try:
            stream = self.client.messages.create(stream=True, **kwargs)
            try:
                for ev in stream:
                    etype = getattr(ev, "type", None)
                    if etype == "message_start":
                        u = getattr(ev.message, "usage", None)
                        if u is not None:
                            usage = {"input_tokens": u.input_tokens, "output_tokens": u.output_tokens or 0}
                    elif etype == "content_block_delta":
                        if getattr(ev.delta, "type", None) == "text_delta":
                            parts.append(ev.delta.text or "")
                    elif etype == "message_delta":
                        u = getattr(ev, "usage", None)
                        if u is not None and getattr(u, "output_tokens", None) is not None:
                            usage["output_tokens"] = u.output_tokens
                            if getattr(u, "input_tokens", None):
                                usage["input_tokens"] = u.input_tokens
                    elif etype == "message_stop":
                        saw_stop = True
            finally:
                stream.close()
        except Exception as exc:  # noqa: BLE001
            raise self.classify(exc, anthropic, usage or None) from None
        if not saw_stop:
            raise Retryable("stream ended before message_stop", None, usage or None)
        return "".join(parts), (usage or None)


def make(target, options: dict) -> AnthropicProvider:
    return AnthropicProvider(target, options)
