"""The anthropic and openai providers, driving the REAL SDK clients against a
local fake server (tests/fake_llm_server.py): what each provider does on
success, 429 + Retry-After, persistent 5xx, 401, malformed JSON, a response
slower than the timeout, streamed answers, and budgets.  Waits go through a
fake sleep, so retry schedules are asserted exactly without waiting."""

from __future__ import annotations

import random
import re
import socket
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fake_llm_server import FakeLLMServer, Reply  # noqa: E402

from porter.providers import get_provider  # noqa: E402
from porter.providers.base import Completion, PromptRequest, ProviderError  # noqa: E402
from porter.providers.budget import BudgetExceeded, usage_record  # noqa: E402
from porter.providers.common import resolve_settings  # noqa: E402
from porter.providers.retry import RetryPolicy, parse_retry_after  # noqa: E402

ANTHROPIC_KEY = "sk-ant-test-SECRET-0123456789"
OPENAI_KEY = "sk-openai-test-SECRET-9876543210"
PROVIDERS = ["anthropic", "openai"]


@pytest.fixture(autouse=True)
def keys(monkeypatch):
    for var in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "PORTER_OPENAI_API_KEY", "PORTER_PROVIDER",
                "PORTER_MODEL", "PORTER_BASE_URL", "OPENAI_BASE_URL", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("ANTHROPIC_API_KEY", ANTHROPIC_KEY)
    monkeypatch.setenv("PORTER_OPENAI_API_KEY", OPENAI_KEY)


def fake_target(provider_table: dict | None = None):
    return SimpleNamespace(name="minimoe", spec=SimpleNamespace(provider=provider_table or {}))


def request(unit: str = "mini_gpu_swiglu_tensor", prompt: str = "port this unit", max_tokens: int | None = 1000):
    return PromptRequest(target="minimoe", unit=unit, attempt=1, system="the rules", prompt=prompt,
                         max_tokens=max_tokens)


def make(name: str, srv: FakeLLMServer | None, sleeps: list | None = None, **options):
    opts = {"model": "test-model", "retry_jitter": 0, "retry_base_s": 1.0, "max_attempts": 4,
            "sleep": (sleeps.append if sleeps is not None else (lambda s: None)), "rng": random.Random(0)}
    if srv is not None:
        opts["base_url"] = srv.url if name == "anthropic" else srv.openai_url
    opts.update(options)
    return get_provider(name, fake_target(), opts)


def endpoint(name: str) -> str:
    return "/v1/messages" if name == "anthropic" else "/v1/chat/completions"


# -- success -------------------------------------------------------------------

@pytest.mark.parametrize("name", PROVIDERS)
def test_success_returns_text_usage_and_cost(name):
    with FakeLLMServer([Reply.answer("```cuda\nint x;\n```", usage=(1200, 300))]) as srv:
        p = make(name, srv, price_input=3.0, price_output=15.0)
        c = p.complete(request())
    assert isinstance(c, Completion)
    assert c.text == "```cuda\nint x;\n```"
    assert (c.provider, c.model) == (name, "test-model")
    assert c.usage["input_tokens"] == 1200 and c.usage["output_tokens"] == 300
    assert c.usage["cost_usd"] == pytest.approx(1200 * 3.0 / 1e6 + 300 * 15.0 / 1e6)
    assert c.usage["calls"] == 1
    [r] = srv.requests
    assert r.path == endpoint(name)
    assert r.body["model"] == "test-model"
    # the SDK's own retries are off: porter decides
    assert r.headers.get("x-stainless-retry-count", r.headers.get("X-Stainless-Retry-Count")) == "0"
    if name == "anthropic":
        assert r.body["system"] == "the rules" and r.body["max_tokens"] == 1000
        assert r.body["messages"] == [{"role": "user", "content": "port this unit"}]
    else:
        assert r.body["messages"][0] == {"role": "system", "content": "the rules"}
        assert r.body["max_tokens"] == 1000  # a base_url means a local server: plain max_tokens


def test_openai_without_base_url_sends_max_completion_tokens():
    p = make("openai", None)
    assert p.max_tokens_param == "max_completion_tokens"
    assert make("openai", None, max_tokens_param="max_tokens").max_tokens_param == "max_tokens"


# -- retries -----------------------------------------------------------------------

@pytest.mark.parametrize("name", PROVIDERS)
def test_429_then_success_honours_retry_after(name):
    sleeps: list[float] = []
    with FakeLLMServer([Reply.error(429, "slow down", retry_after="7"), Reply.answer("ok")]) as srv:
        c = make(name, srv, sleeps).complete(request())
    assert c.text == "ok"
    assert len(srv.requests) == 2
    assert sleeps == [7.0]  # Retry-After replaces the computed backoff
    assert c.usage["calls"] == 2


@pytest.mark.parametrize("name", PROVIDERS)
def test_500_retried_with_exponential_backoff_then_one_line_error(name):
    sleeps: list[float] = []
    with FakeLLMServer(default=Reply.error(500, "internal\nboom")) as srv:
        p = make(name, srv, sleeps, max_attempts=4, retry_base_s=2.0)
        with pytest.raises(ProviderError) as ei:
            p.complete(request())
    assert len(srv.requests) == 4
    assert sleeps == [2.0, 4.0, 8.0]
    msg = str(ei.value)
    assert "\n" not in msg
    assert msg.startswith(f"{name}: HTTP 500") and "gave up after 4 attempts" in msg
    assert ei.value.usage["calls"] == 4


def test_backoff_is_capped_and_jittered():
    pol = RetryPolicy(base_s=2.0, factor=2.0, cap_s=10.0, jitter=0.5)
    rng = random.Random(1)
    waits = [pol.backoff(i, rng) for i in range(8)]
    assert all(0 < w <= 10.0 for w in waits)
    assert 1.5 <= waits[0] <= 2.5  # 2s +-25%
    assert len(set(waits)) > 1
    exact = RetryPolicy(base_s=2.0, cap_s=10.0, jitter=0)
    assert [exact.backoff(i, rng) for i in range(5)] == [2.0, 4.0, 8.0, 10.0, 10.0]


def test_retry_after_forms():
    assert parse_retry_after({"retry-after": "3"}) == 3.0
    assert parse_retry_after({"retry-after-ms": "1500"}) == 1.5
    assert parse_retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, now=1445412470.0) == pytest.approx(10.0)
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({}) is None


@pytest.mark.parametrize("name", PROVIDERS)
def test_retry_after_is_capped(name):
    sleeps: list[float] = []
    with FakeLLMServer([Reply.error(503, retry_after="86400"), Reply.answer("ok")]) as srv:
        make(name, srv, sleeps, retry_after_cap_s=120).complete(request())
    assert sleeps == [120.0]


@pytest.mark.parametrize("name", PROVIDERS)
def test_connection_refused_fails_at_once_naming_the_server(name):
    """Nothing listening (a local server not started): one line at once, not a minute of retries."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    sleeps: list[float] = []
    base = f"http://127.0.0.1:{port}" + ("" if name == "anthropic" else "/v1")
    p = make(name, None, sleeps, base_url=base, max_attempts=6)
    with pytest.raises(ProviderError, match=f"connection refused by {re.escape(base)}.*server running") as ei:
        p.complete(request())
    assert sleeps == [] and "\n" not in str(ei.value)
    assert ei.value.usage["calls"] == 1


# -- no retry -------------------------------------------------------------------------

@pytest.mark.parametrize("name", PROVIDERS)
@pytest.mark.parametrize("status", [401, 403])
def test_bad_credentials_fail_at_once_in_one_line_without_the_key(name, status):
    key = ANTHROPIC_KEY if name == "anthropic" else OPENAI_KEY
    sleeps: list[float] = []
    # a server that echoes the key it was sent: porter must not repeat it
    with FakeLLMServer(default=Reply.error(status, f"invalid x-api-key {key}\nsee docs")) as srv:
        p = make(name, srv, sleeps)
        with pytest.raises(ProviderError) as ei:
            p.complete(request())
    assert len(srv.requests) == 1 and sleeps == []
    msg = str(ei.value)
    assert "\n" not in msg and key not in msg and "<redacted>" in msg
    assert f"authentication failed (HTTP {status})" in msg
    assert ("ANTHROPIC_API_KEY" if name == "anthropic" else "OPENAI_API_KEY") in msg
    assert key not in repr(p)


@pytest.mark.parametrize("name", PROVIDERS)
def test_other_4xx_is_not_retried(name):
    with FakeLLMServer(default=Reply.error(400, "prompt is too long")) as srv:
        with pytest.raises(ProviderError, match=r"request refused \(HTTP 400\): prompt is too long"):
            make(name, srv).complete(request())
    assert len(srv.requests) == 1


@pytest.mark.parametrize("name", PROVIDERS)
@pytest.mark.parametrize("reply", [Reply.malformed(), Reply.malformed(b'{"unexpected": 1}'),
                                   Reply(status=200, body="<html>gateway</html>", content_type="text/html")],
                         ids=["truncated-json", "wrong-shape", "html"])
def test_malformed_response_is_a_provider_error(name, reply):
    with FakeLLMServer([reply]) as srv:
        with pytest.raises(ProviderError, match=f"^{name}: malformed response"):
            make(name, srv).complete(request())
    assert len(srv.requests) == 1


@pytest.mark.parametrize("name", PROVIDERS)
def test_response_slower_than_the_timeout(name):
    sleeps: list[float] = []
    with FakeLLMServer(default=Reply.answer("late", delay_s=1.5)) as srv:
        p = make(name, srv, sleeps, timeout_s=0.3, max_attempts=2)
        with pytest.raises(ProviderError, match=r"timed out after 0.3s .*gave up after 2 attempts"):
            p.complete(request())
    assert len(srv.requests) == 2
    assert sleeps == [1.0]


# -- streaming -------------------------------------------------------------------------

@pytest.mark.parametrize("name", PROVIDERS)
def test_streamed_answer_is_accumulated(name):
    text = "Here it is.\n```cuda\n#include \"mini_cuda.cuh\"\nextern \"C\" int f(void) { return 0; }\n```\n"
    with FakeLLMServer([Reply.answer(text, usage=(321, 123))]) as srv:
        c = make(name, srv, stream=True).complete(request())
    assert c.text == text
    assert (c.usage["input_tokens"], c.usage["output_tokens"]) == (321, 123)
    assert srv.requests[0].body["stream"] is True
    if name == "openai":
        assert srv.requests[0].body["stream_options"] == {"include_usage": True}


def test_openai_stream_without_usage_is_estimated():
    with FakeLLMServer([Reply.answer("x" * 300)]) as srv:
        c = make("openai", srv, stream=True, stream_usage=False).complete(request(prompt="p" * 30))
    assert c.usage["estimated"] is True
    assert c.usage["output_tokens"] == 100  # 300 chars / 3
    assert usage_record(c)["estimated"] is True


def test_anthropic_stream_error_is_retried_and_its_usage_counted():
    sleeps: list[float] = []
    with FakeLLMServer([Reply.answer("partial", usage=(500, 7), stream=True, stream_error=True),
                        Reply.answer("whole", usage=(500, 40))]) as srv:
        c = make("anthropic", srv, sleeps, stream=True).complete(request())
    assert c.text == "whole"
    assert len(srv.requests) == 2 and sleeps == [1.0]
    # the failed attempt's input tokens were billed: they are in the usage too
    assert c.usage["input_tokens"] == 1000
    assert c.usage["calls"] == 2


# -- budgets ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", PROVIDERS)
def test_unit_token_budget_stops_before_the_call(name):
    with FakeLLMServer(default=Reply.answer("ok", usage=(600, 400))) as srv:
        p = make(name, srv, budget_unit_tokens=2500)
        p.complete(request(max_tokens=1000))  # worst case ~5+1000: allowed; spends 1000
        with pytest.raises(BudgetExceeded) as ei:
            p.complete(request(max_tokens=1600))  # 1000 spent + up to ~1605 > 2500
        assert ei.value.scope == "unit"
        assert "token budget of mini_gpu_swiglu_tensor reached: 1,000 of 2,500" in str(ei.value)
        assert len(srv.requests) == 1  # refused before sending anything
        # another unit has its own budget
        p.complete(request(unit="mini_gpu_add_tensor", max_tokens=1000))
    assert len(srv.requests) == 2


@pytest.mark.parametrize("name", PROVIDERS)
def test_run_cost_budget_stops_the_run(name):
    with FakeLLMServer(default=Reply.answer("ok", usage=(100_000, 10_000))) as srv:
        p = make(name, srv, price_input=3.0, price_output=15.0, budget_run_usd=1.0)
        p.complete(request(max_tokens=10_000))  # spends $0.45; worst case ~$0.15
        p.complete(request(unit="mini_gpu_add_tensor", max_tokens=10_000))  # $0.90 spent
        with pytest.raises(BudgetExceeded) as ei:
            p.complete(request(unit="mini_gpu_rope_tail_tensor", max_tokens=10_000))
    assert ei.value.scope == "run"
    assert "run cost budget reached: $0.9000 of $1.00" in str(ei.value)
    assert len(srv.requests) == 2


def test_cost_budget_without_prices_is_refused():
    with pytest.raises(ProviderError, match="a cost budget needs prices"):
        make("anthropic", None, budget_unit_usd=1.0)


def test_retries_count_against_the_budget():
    with FakeLLMServer([Reply.answer("cut", usage=(900, 1), stream=True, stream_error=True),
                        Reply.answer("never", usage=(900, 1))]) as srv:
        p = make("anthropic", srv, stream=True, budget_unit_tokens=1300)
        with pytest.raises(BudgetExceeded) as ei:
            p.complete(request(max_tokens=500))
    assert len(srv.requests) == 1
    assert ei.value.usage["input_tokens"] == 900  # the spent attempt is still reported


# -- usage records ------------------------------------------------------------------------

def test_usage_record_of_a_completion_and_of_an_error():
    with FakeLLMServer([Reply.answer("ok", usage=(10, 20))]) as srv:
        c = make("openai", srv, price_input=1.0, price_output=2.0).complete(request())
    rec = usage_record(c)
    assert rec == {"target": "minimoe", "unit": "mini_gpu_swiglu_tensor", "provider": "openai", "model": "test-model",
                   "input_tokens": 10, "output_tokens": 20, "cost_usd": pytest.approx(5e-05), "calls": 1}
    assert "kind" not in rec  # Ledger.append(kind, **fields) sets it
    with FakeLLMServer(default=Reply.error(500)) as srv:
        with pytest.raises(ProviderError) as ei:
            make("openai", srv, max_attempts=2).complete(request())
    rec = usage_record(ei.value)
    assert rec["calls"] == 2 and rec["input_tokens"] == 0 and "HTTP 500" in rec["error"]


# -- settings and keys ----------------------------------------------------------------------

def test_settings_precedence_cli_env_toml(monkeypatch):
    target = fake_target({"name": "openai", "model": "toml-model", "base_url": "http://toml/v1", "max_tokens": 2000,
                          "prices": {"input": 1.0, "output": 2.0}, "budget": {"unit_usd": 0.5},
                          "anthropic": {"model": "claude-toml"}})
    s = resolve_settings(target, {})
    assert (s["name"], s["model"], s["base_url"], s["max_tokens"]) == ("openai", "toml-model", "http://toml/v1", 2000)
    assert (s["price_input"], s["price_output"], s["budget_unit_usd"]) == (1.0, 2.0, 0.5)
    monkeypatch.setenv("PORTER_MODEL", "env-model")
    monkeypatch.setenv("PORTER_BASE_URL", "http://env/v1")
    s = resolve_settings(target, {})
    assert (s["model"], s["base_url"]) == ("env-model", "http://env/v1")
    s = resolve_settings(target, {"model": "cli-model", "base_url": None})
    assert (s["model"], s["base_url"]) == ("cli-model", "http://env/v1")
    monkeypatch.delenv("PORTER_MODEL")
    # another provider chosen: the top-level table (named openai) does not apply, its own subtable does
    s = resolve_settings(target, {"provider": "anthropic"})
    assert s["model"] == "claude-toml" and "max_tokens" not in s


def test_api_key_in_target_toml_is_refused():
    with pytest.raises(ProviderError, match="API keys are read from the environment only"):
        resolve_settings(fake_target({"name": "anthropic", "api_key": "sk-oops"}), {})
    with pytest.raises(ProviderError, match="environment only"):
        resolve_settings(fake_target({"openai": {"api_key": "sk-oops"}}), {"provider": "openai"})


def test_missing_key_and_missing_model(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    with pytest.raises(ProviderError, match="needs an API key in the environment: set ANTHROPIC_API_KEY"):
        make("anthropic", None)
    monkeypatch.delenv("PORTER_OPENAI_API_KEY")
    with pytest.raises(ProviderError, match="PORTER_OPENAI_API_KEY or OPENAI_API_KEY"):
        make("openai", None)
    # a local server needs no key
    with FakeLLMServer([Reply.answer("ok")]) as srv:
        assert make("openai", srv).complete(request()).text == "ok"
        assert srv.requests[0].headers.get("authorization") == "Bearer sk-no-key-required"
    monkeypatch.setenv("ANTHROPIC_API_KEY", ANTHROPIC_KEY)
    with pytest.raises(ProviderError, match="no model for provider anthropic"):
        get_provider("anthropic", fake_target(), {"base_url": "http://127.0.0.1:9"})
    with pytest.raises(ProviderError, match="no model given and http://127.0.0.1:9/v1/models could not be listed"):
        get_provider("openai", fake_target(), {"base_url": "http://127.0.0.1:9/v1"})


def test_openai_local_server_model_is_discovered():
    with FakeLLMServer([Reply.answer("ok")], model_id="qwen-coder-local") as srv:
        p = get_provider("openai", fake_target(), {"base_url": srv.openai_url})
        assert p.model == "qwen-coder-local"
        c = p.complete(request())
    assert c.model == "qwen-coder-local" and srv.requests[-1].body["model"] == "qwen-coder-local"


def test_openai_key_order(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-generic-key-000000")
    with FakeLLMServer([Reply.answer("ok")]) as srv:
        make("openai", srv).complete(request())
    assert srv.requests[0].headers["authorization"] == f"Bearer {OPENAI_KEY}"  # PORTER_OPENAI_API_KEY first


def test_a_resumed_run_counts_the_usage_its_history_records(tmp_path):
    """porter run seeds per-unit budgets from the ledger's usage records as porter.records.history types them:
    a unit that spent its token budget in an earlier run is refused before the next call."""
    from porter.records.history import History
    from porter.records.ledger import Ledger
    from porter.providers.budget import Budget, BudgetExceeded

    ledger = Ledger(tmp_path)
    ledger.append("usage", target="t", unit="u", provider="openai", input_tokens=900, output_tokens=200, cost_usd=0.5)
    ledger.append("usage", target="t", unit="other", provider="openai", input_tokens=10, output_tokens=0)
    budget = Budget.from_options({"budget_unit_tokens": 1500})
    budget.seed([r for r in History.read(tmp_path, "t").records if r.kind == "usage"])
    assert (budget.unit_spent("u").tokens, budget.unit_spent("u").usd) == (1100, 0.5)
    budget.check("other", 100, 100)
    with pytest.raises(BudgetExceeded):
        budget.check("u", 300, 200)
