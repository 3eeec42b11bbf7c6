"""The `openai` provider: Chat Completions through the official SDK, for OpenAI
itself and for OpenAI-compatible local servers (vLLM, llama.cpp server,
Ollama) given a base_url such as http://127.0.0.1:8000/v1.

The key comes from PORTER_OPENAI_API_KEY, then OPENAI_API_KEY.  A local server
(any base_url) without a key gets a placeholder, since those servers ignore it.
The output limit is sent as max_tokens to a base_url (what local servers
understand) and as max_completion_tokens to OpenAI itself; the setting
`max_tokens_param` overrides.  With stream = true the deltas are joined and
stream_options.include_usage asks for the usage chunk (`stream_usage = false`
for a server that refuses it; usage is then estimated and marked so).
"""

from __future__ import annotations

import openai

from porter.providers.base import ProviderError
from porter.providers.common import HttpProvider, malformed
from porter.providers.retry import Retryable

LOCAL_PLACEHOLDER_KEY = "sk-no-key-required"


class OpenAIProvider(HttpProvider):
    name = "openai"
    key_envs = ("PORTER_OPENAI_API_KEY", "OPENAI_API_KEY")
    sdk_client = openai.OpenAI

    def _missing_key(self):
        return LOCAL_PLACEHOLDER_KEY if self.settings.get("base_url") else None

    def _default_model(self):
        """A local server (base_url) without a configured model: the first model its
        /models lists (vLLM, llama.cpp server and Ollama all answer it)."""
        if not self.base_url:
            return None
        try:
            page = self.client.models.list(timeout=min(30.0, self.timeout_s))
            ids = [m.id for m in page.data if getattr(m, "id", None)]
        except Exception as exc:  # noqa: BLE001 - any failure: ask for --model
            raise ProviderError(self.redact(
                f"no model given and {self.base_url}/models could not be listed ({type(exc).__name__}: "
                f"{' '.join(str(exc).split())[:160]}); pass --model or set PORTER_MODEL")) from None
        if not ids:
            raise ProviderError(f"no model given and {self.base_url}/models lists none; pass --model or set PORTER_MODEL")
        return ids[0]

    @property
    def max_tokens_param(self) -> str:
        explicit = self.settings.get("max_tokens_param")
        if explicit:
            return str(explicit)
        return "max_tokens" if self.base_url else "max_completion_tokens"

    def _request(self, req, max_tokens: int) -> dict:
        messages = []
        if getattr(req, "system", None):
            messages.append({"role": "system", "content": req.system})
        messages.append({"role": "user", "content": req.prompt})
        return {"model": self.model, "messages": messages, self.max_tokens_param: max_tokens}

    def _call(self, req, max_tokens):
        kwargs = self._request(req, max_tokens)
        if self.stream:
            return self._call_stream(kwargs)
        try:
            resp = self.client.chat.completions.create(**kwargs)
        except Exception as exc:  # noqa: BLE001 - classify() re-raises what it does not know
            raise self.classify(exc, openai) from None
        if not isinstance(resp, openai.types.chat.ChatCompletion):
            raise malformed(f"expected a JSON ChatCompletion, got {type(resp).__name__}")
        usage = _usage(resp.usage)
        if not resp.choices or getattr(resp.choices[0], "message", None) is None:
            raise malformed("no choices[0].message in the ChatCompletion", usage)
        msg = resp.choices[0].message
        return (msg.content or ""), usage

    def _call_stream(self, kwargs):
        parts: list[str] = []
        usage = None
        finished = False
        if str(self.settings.get("stream_usage", True)).lower() not in ("0", "false", "no", "off"):
            kwargs["stream_options"] = {"include_usage": True}
        try:
            stream = self.client.chat.completions.create(stream=True, **kwargs)
            try:
                for chunk in stream:
                    if getattr(chunk, "usage", None) is not None:
                        usage = _usage(chunk.usage)
                    for choice in chunk.choices or []:
                        delta = getattr(choice, "delta", None)
                        if delta is not None and delta.content:
                            parts.append(delta.content)
                        if getattr(choice, "finish_reason", None):
                            finished = True
            finally:
                stream.close()
        except Exception as exc:  # noqa: BLE001
            raise self.classify(exc, openai, usage) from None
        if not finished:
            raise Retryable("stream ended without a finish_reason", None, usage)
        return "".join(parts), usage


def _usage(u) -> dict | None:
    if u is None:
        return None
    return {"input_tokens": getattr(u, "prompt_tokens", None), "output_tokens": getattr(u, "completion_tokens", None)}


def make(target, options: dict) -> OpenAIProvider:
    return OpenAIProvider(target, options)
