"""What the HTTP providers (anthropic, openai) share: settings resolution,
API keys from the environment, the retry/budget/usage wrapper around one call,
and the mapping of SDK exceptions to retry decisions.

Settings, highest first: options from the command line (--provider, --model,
--base-url, ...), the environment (PORTER_PROVIDER, PORTER_MODEL,
PORTER_BASE_URL), target.toml's [provider] table, built-in defaults:

    [provider]
    name = "anthropic"          # or "openai" (also for vLLM / llama.cpp / Ollama)
    model = "..."
    base_url = "http://127.0.0.1:8000/v1"   # optional
    max_tokens = 16000
    timeout_s = 600
    stream = false
    max_attempts = 6            # retries of 429 / 5xx / connection errors / timeouts
    prices = { input = 3.0, output = 15.0 }           # USD per million tokens
    budget = { run_usd = 20.0, unit_usd = 2.0, run_tokens = 2000000, unit_tokens = 300000 }
    [provider.openai]           # applies only when the openai provider is chosen
    model = "..."

The top-level keys apply when `name` is unset or names the chosen provider;
[provider.<name>] always applies to <name>.  API keys are never read from
target.toml (an api_key there is an error): only from the environment.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from typing import Any

from porter.providers.budget import Budget, BudgetExceeded, ProviderError, add_usage, empty_usage, estimate_tokens
from porter.providers.retry import Fatal, GaveUp, Retryable, RetryLog, RetryPolicy, call_with_retries, parse_retry_after

from porter.providers.base import Completion, Provider

_log = logging.getLogger("porter.providers")

DEFAULT_MAX_TOKENS = 16000
DEFAULT_TIMEOUT_S = 600.0
ENV_PROVIDER, ENV_MODEL, ENV_BASE_URL = "PORTER_PROVIDER", "PORTER_MODEL", "PORTER_BASE_URL"

# keys a table in target.toml may flatten into options
_NESTED = {"prices": {"input": "price_input", "output": "price_output"},
           "budget": {"run_tokens": "budget_run_tokens", "unit_tokens": "budget_unit_tokens",
                      "run_usd": "budget_run_usd", "unit_usd": "budget_unit_usd"}}
_SECRET_KEYS = {"api_key", "apikey", "key", "token", "auth_token", "secret"}


def _flatten(table: dict, where: str) -> dict:
    out: dict = {}
    for k, v in table.items():
        if k.lower() in _SECRET_KEYS:
            raise ProviderError(f"{where} has {k!r}: API keys are read from the environment only "
                                "(ANTHROPIC_API_KEY, OPENAI_API_KEY or PORTER_OPENAI_API_KEY); remove it")
        if k in _NESTED and isinstance(v, dict):
            for kk, vv in v.items():
                if kk not in _NESTED[k]:
                    raise ProviderError(f"{where}.{k} has unknown key {kk!r} (known: {', '.join(_NESTED[k])})")
                out[_NESTED[k][kk]] = vv
        elif not isinstance(v, dict):
            out[k] = v
    return out


def resolve_settings(target, options: dict | None = None, env: dict | None = None) -> dict:
    """Merge command-line options, the environment and target.toml [provider].

    Returns a flat dict: name, model, base_url, max_tokens, timeout_s, stream,
    max_attempts, price_input, price_output, budget_* and whatever else was set.
    Values of None in `options` mean "not given on the command line".
    """
    env = os.environ if env is None else env
    options = {k: v for k, v in (options or {}).items() if v is not None}
    toml = dict(getattr(getattr(target, "spec", None), "provider", None) or {})
    name = options.get("provider") or options.get("name") or env.get(ENV_PROVIDER) or toml.get("name")
    merged: dict = {}
    if toml.get("name") in (None, name):
        merged.update(_flatten({k: v for k, v in toml.items() if k != "name"}, "target.toml [provider]"))
    sub = toml.get(name) if name else None
    if isinstance(sub, dict):
        merged.update(_flatten(sub, f"target.toml [provider.{name}]"))
    if env.get(ENV_MODEL):
        merged["model"] = env[ENV_MODEL]
    if env.get(ENV_BASE_URL):
        merged["base_url"] = env[ENV_BASE_URL]
    for k, v in options.items():
        if k.lower() in _SECRET_KEYS:
            raise ProviderError(f"option {k!r} refused: API keys are read from the environment only")
        merged[k] = v
    merged["name"] = name
    merged.pop("provider", None)
    return merged


def _one_line(text: Any, limit: int = 300) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


class HttpProvider(Provider):
    """A provider that talks to a server through an official SDK client."""

    name = "?"
    key_envs: tuple[str, ...] = ()
    sdk_client: type  # anthropic.Anthropic / openai.OpenAI

    def __init__(self, target, options: dict | None = None):
        options = dict(options or {})
        # test hooks (never from the command line)
        self.sleep = options.pop("sleep", None) or time.sleep
        self.rng = options.pop("rng", None) or random.Random()
        http_client = options.pop("http_client", None)
        s = resolve_settings(target, {**options, "provider": self.name})
        self.settings = s
        self.model = s.get("model")
        self.base_url = s.get("base_url") or None
        try:
            self.max_tokens = int(s.get("max_tokens") or DEFAULT_MAX_TOKENS)
            self.timeout_s = float(s.get("timeout_s") or DEFAULT_TIMEOUT_S)
        except (TypeError, ValueError) as exc:
            raise ProviderError(f"provider {self.name}: bad max_tokens/timeout_s setting: {exc}") from None
        self.stream = str(s.get("stream", False)).lower() in ("1", "true", "yes", "on")
        self.policy = RetryPolicy.from_options(s)
        self.budget = Budget.from_options(s)
        self._api_key = self._find_key()
        self.client = self._make_client(http_client)
        self.last_log = RetryLog()
        if not self.model:
            self.model = self._default_model()
        if not self.model:
            raise ProviderError(f"no model for provider {self.name}: pass --model, set {ENV_MODEL}, "
                                "or set [provider] model in target.toml")

    def _default_model(self) -> str | None:
        """A model when none is configured (the openai provider asks a local server), else None."""
        return None

    def _make_client(self, http_client):
        """The SDK client, with its own retries off: retries are porter's (see retry.py)."""
        import httpx2  # the transport both SDKs are built on

        kwargs = dict(api_key=self._api_key, max_retries=0,
                      timeout=httpx2.Timeout(self.timeout_s, connect=min(30.0, self.timeout_s)))
        if self.base_url:
            kwargs["base_url"] = self.base_url
        if http_client is not None:
            kwargs["http_client"] = http_client
        return self.sdk_client(**kwargs)

    # -- to be provided by each provider --
    def _call(self, req, max_tokens: int) -> tuple[str, dict | None]:  # pragma: no cover - abstract
        """One HTTP attempt: (text, {"input_tokens", "output_tokens"} or None);
        raises Retryable or Fatal (with the usage seen so far, if any)."""
        raise NotImplementedError

    def _missing_key(self) -> str | None:
        """The key to use when none is set, or None to refuse."""
        return None

    # -- shared --
    def _find_key(self) -> str:
        for var in self.key_envs:
            if os.environ.get(var):
                return os.environ[var]
        fallback = self._missing_key()
        if fallback is not None:
            return fallback
        raise ProviderError(f"provider {self.name} needs an API key in the environment: set {' or '.join(self.key_envs)}")

    def redact(self, text: Any) -> str:
        s = str(text)
        key = getattr(self, "_api_key", None)
        if key and len(key) >= 6:
            s = s.replace(key, "<redacted>")
        return s

    def describe(self) -> str:
        where = f" at {self.base_url}" if self.base_url else ""
        return f"{self.name} model {self.model}{where}"

    def __repr__(self) -> str:  # never shows the key
        return f"<{type(self).__name__} {self.describe()}>"

    def _priced(self, raw: dict | None, est_in: int, text: str = "") -> dict:
        if raw is None or (raw.get("input_tokens") is None and raw.get("output_tokens") is None):
            raw = {"input_tokens": est_in, "output_tokens": estimate_tokens(text), "estimated": True}
        i, o = int(raw.get("input_tokens") or 0), int(raw.get("output_tokens") or 0)
        return {"input_tokens": i, "output_tokens": o, "cost_usd": self.budget.prices.cost(i, o), "calls": 1,
                "estimated": bool(raw.get("estimated"))}

    def complete(self, req):
        max_tokens = int(getattr(req, "max_tokens", None) or self.max_tokens)
        est_in = estimate_tokens((getattr(req, "system", "") or "") + (req.prompt or ""))
        total = empty_usage()
        total.update(target=getattr(req, "target", None), unit=req.unit, provider=self.name, model=self.model)
        log = RetryLog()
        self.last_log = log

        def account(raw: dict | None, text: str = "") -> None:
            part = self._priced(raw, est_in, text)
            self.budget.record(req.unit, part)
            add_usage(total, part)

        def attempt(n: int) -> str:
            self.budget.check(req.unit, est_in, max_tokens)
            text, raw = self._call(req, max_tokens)
            account(raw, text)
            return text

        def fail(message: str) -> ProviderError:
            total["calls"] = log.attempts
            err = ProviderError(self.redact(f"{self.name}: {message}"))
            err.usage = total
            return err

        def on_retry(n: int, wait: float, reason: str) -> None:
            _log.warning("%s: %s; retry %d of %d in %.1fs", self.name, self.redact(reason), n,
                         self.policy.max_attempts - 1, wait)

        try:
            text = call_with_retries(attempt, self.policy, sleep=self.sleep, rng=self.rng,
                                     on_usage=lambda u: account(u), on_retry=on_retry, log=log)
        except GaveUp as exc:
            raise fail(str(exc)) from None
        except Fatal as exc:
            raise fail(exc.message) from None
        except BudgetExceeded as exc:
            total["calls"] = log.attempts - 1  # the refused attempt was never sent
            exc.usage = total
            raise
        total["calls"] = log.attempts  # HTTP attempts, failed ones included
        return Completion(text=text, provider=self.name, model=self.model, usage=total)

    # -- SDK exceptions -> retry decisions (both SDKs share the stainless shapes) --
    def classify(self, exc: BaseException, sdk, usage: dict | None = None) -> Exception:
        """Return Retryable or Fatal for an exception raised by an SDK call."""
        status = getattr(exc, "status_code", None)
        if isinstance(exc, (sdk.AuthenticationError, sdk.PermissionDeniedError)):
            return Fatal(f"authentication failed (HTTP {status}): {_one_line(self._api_message(exc))}; "
                         f"check {' / '.join(self.key_envs) or 'the API key'}", usage)
        if isinstance(exc, sdk.APITimeoutError):
            return Retryable(f"timed out after {self.timeout_s:g}s", None, usage)
        if _refused(exc):
            return self._refused(usage)
        if isinstance(exc, sdk.APIConnectionError):
            cause = exc.__cause__ or exc.__context__
            return Retryable(f"connection error: {_one_line(cause or exc, 160)}", None, usage)
        if isinstance(exc, sdk.APIStatusError):
            headers = getattr(getattr(exc, "response", None), "headers", None)
            msg = _one_line(self._api_message(exc))
            if status in (408, 409, 429) or (status is not None and status >= 500):
                return Retryable(f"HTTP {status}: {msg}", parse_retry_after(headers), usage)
            if status == 200:  # an error event inside a stream
                etype = getattr(exc, "type", None) or _error_type(getattr(exc, "body", None))
                if etype in (None, "overloaded_error", "api_error", "rate_limit_error", "server_error"):
                    return Retryable(f"stream error: {msg}", None, usage)
            return Fatal(f"request refused (HTTP {status}): {msg}", usage)
        if isinstance(exc, (json.JSONDecodeError, sdk.APIResponseValidationError)):
            return Fatal(f"malformed response: {_one_line(exc, 160)}", usage)
        if isinstance(exc, sdk.APIError):  # e.g. an error chunk inside an OpenAI stream
            return Retryable(f"stream error: {_one_line(self._api_message(exc))}", None, usage)
        try:
            import httpx2
        except ImportError:  # pragma: no cover
            httpx2 = None
        if httpx2 is not None and isinstance(exc, httpx2.TimeoutException):
            return Retryable(f"timed out after {self.timeout_s:g}s", None, usage)
        if httpx2 is not None and isinstance(exc, httpx2.TransportError):
            return Retryable(f"connection error: {_one_line(exc, 160)}", None, usage)
        if isinstance(exc, ValueError):
            return Fatal(f"malformed response: {_one_line(exc, 160)}", usage)
        raise exc

    def _refused(self, usage: dict | None) -> Fatal:
        """Nothing listens at the address: no server is running there (a local one not started, a
        wrong port). Waiting a minute of retries for it helps no one."""
        where = self.base_url or "the provider's API"
        return Fatal(f"connection refused by {where}: is the server running and is the URL right "
                     f"(--base-url / PORTER_BASE_URL)?", usage)

    @staticmethod
    def _api_message(exc) -> str:
        body = getattr(exc, "body", None)
        if isinstance(body, dict):
            err = body.get("error", body)
            if isinstance(err, dict) and err.get("message"):
                return str(err["message"])
            if isinstance(err, str):
                return err
        return getattr(exc, "message", None) or str(exc)


def _refused(exc: BaseException) -> bool:
    """Whether `exc` (or what it wraps) is a refused TCP connection."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ConnectionRefusedError) or "connection refused" in str(exc).lower():
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _error_type(body) -> str | None:
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            return err.get("type")
    return None


def malformed(what: str, usage: dict | None = None) -> Fatal:
    return Fatal(f"malformed response: {what}", usage)
