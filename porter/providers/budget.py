"""Token and cost budgets, per run and per unit, and the ledger's usage record.

A budget is checked BEFORE every HTTP attempt (retries included) against the
worst case of that attempt: the prompt's estimated input tokens (characters /
3, an over-estimate for code and English) plus the request's max_tokens.  A
call that could push a total past its limit is not made; `BudgetExceeded`
says which limit, how much is spent and how to raise it.  After each attempt
the usage the server reported is added (or, when a server reports none, the
estimate, marked `estimated`).

Prices are USD per million tokens ([provider] prices = {input = 3.0, output =
15.0} in target.toml, or options price_input / price_output).  Without prices
cost_usd is None and a cost budget is refused up front rather than ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


from porter.providers.base import ProviderError


CHARS_PER_TOKEN_ESTIMATE = 3.0


def estimate_tokens(text: str) -> int:
    return int(math.ceil(len(text) / CHARS_PER_TOKEN_ESTIMATE))


@dataclass(frozen=True)
class Prices:
    input_per_mtok: float | None = None
    output_per_mtok: float | None = None

    @property
    def known(self) -> bool:
        return self.input_per_mtok is not None and self.output_per_mtok is not None

    def cost(self, input_tokens: int, output_tokens: int) -> float | None:
        if not self.known:
            return None
        return round(input_tokens * self.input_per_mtok / 1e6 + output_tokens * self.output_per_mtok / 1e6, 6)


@dataclass(frozen=True)
class Limits:
    run_tokens: int | None = None
    unit_tokens: int | None = None
    run_usd: float | None = None
    unit_usd: float | None = None

    @property
    def any_cost(self) -> bool:
        return self.run_usd is not None or self.unit_usd is not None


class BudgetExceeded(ProviderError):
    """The next call could exceed a budget; `scope` is "run" or "unit".

    The loop stops the whole run for scope "run" and moves past the unit
    for scope "unit" (the unit is not failed by its candidate: no attempt
    was made)."""

    exit_code = 1

    def __init__(self, message: str, scope: str, unit: str | None = None):
        super().__init__(message)
        self.scope = scope
        self.unit = unit


def empty_usage() -> dict:
    return {"input_tokens": 0, "output_tokens": 0, "cost_usd": None, "calls": 0, "estimated": False}


def add_usage(total: dict, part: dict) -> dict:
    """Add `part` into `total` in place (cost stays None only while every part's is None)."""
    total["input_tokens"] = int(total.get("input_tokens") or 0) + int(part.get("input_tokens") or 0)
    total["output_tokens"] = int(total.get("output_tokens") or 0) + int(part.get("output_tokens") or 0)
    if part.get("cost_usd") is not None:
        total["cost_usd"] = round((total.get("cost_usd") or 0.0) + part["cost_usd"], 6)
    total["calls"] = int(total.get("calls") or 0) + int(part.get("calls", 1) or 0)
    total["estimated"] = bool(total.get("estimated")) or bool(part.get("estimated"))
    return total


@dataclass
class _Spent:
    tokens: int = 0
    usd: float = 0.0


@dataclass
class Budget:
    limits: Limits = field(default_factory=Limits)
    prices: Prices = field(default_factory=Prices)
    run: _Spent = field(default_factory=_Spent)
    units: dict[str, _Spent] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.limits.any_cost and not self.prices.known:
            raise ProviderError(
                "a cost budget needs prices: set [provider] prices = {input = USD, output = USD} per million tokens "
                "in target.toml, or --price-input/--price-output"
            )

    @classmethod
    def from_options(cls, options: dict) -> "Budget":
        def num(key, kind):
            v = options.get(key)
            if v is None or v == "":
                return None
            try:
                v = kind(v)
            except (TypeError, ValueError):
                raise ProviderError(f"provider option {key} must be a number, got {options[key]!r}") from None
            if v < 0:
                raise ProviderError(f"provider option {key} must not be negative, got {v}")
            return v

        return cls(
            Limits(num("budget_run_tokens", int), num("budget_unit_tokens", int),
                   num("budget_run_usd", float), num("budget_unit_usd", float)),
            Prices(num("price_input", float), num("price_output", float)),
        )

    def unit_spent(self, unit: str) -> _Spent:
        return self.units.setdefault(unit, _Spent())

    def check(self, unit: str, est_input_tokens: int, max_output_tokens: int) -> None:
        """Raise BudgetExceeded if a call of this worst case could pass a limit."""
        worst_tokens = est_input_tokens + max_output_tokens
        worst_usd = self.prices.cost(est_input_tokens, max_output_tokens) or 0.0
        u = self.unit_spent(unit)
        how = (f"the next call could use up to {worst_tokens:,} tokens "
               f"(prompt ~{est_input_tokens:,} + max_tokens {max_output_tokens:,})")
        L = self.limits
        if L.run_tokens is not None and self.run.tokens + worst_tokens > L.run_tokens:
            raise BudgetExceeded(f"run token budget reached: {self.run.tokens:,} of {L.run_tokens:,} tokens spent and "
                                 f"{how}; raise budget_run_tokens ([provider.budget] run_tokens or --budget-run-tokens)",
                                 "run", unit)
        if L.run_usd is not None and self.run.usd + worst_usd > L.run_usd:
            raise BudgetExceeded(f"run cost budget reached: ${self.run.usd:.4f} of ${L.run_usd:.2f} spent and the next "
                                 f"call could cost up to ${worst_usd:.4f}; raise budget_run_usd "
                                 "([provider.budget] run_usd or --budget-run-usd)", "run", unit)
        if L.unit_tokens is not None and u.tokens + worst_tokens > L.unit_tokens:
            raise BudgetExceeded(f"token budget of {unit} reached: {u.tokens:,} of {L.unit_tokens:,} tokens spent and "
                                 f"{how}; raise budget_unit_tokens ([provider.budget] unit_tokens or "
                                 "--budget-unit-tokens)", "unit", unit)
        if L.unit_usd is not None and u.usd + worst_usd > L.unit_usd:
            raise BudgetExceeded(f"cost budget of {unit} reached: ${u.usd:.4f} of ${L.unit_usd:.2f} spent and the next "
                                 f"call could cost up to ${worst_usd:.4f}; raise budget_unit_usd "
                                 "([provider.budget] unit_usd or --budget-unit-usd)", "unit", unit)

    def record(self, unit: str, usage: dict) -> None:
        tokens = int(usage.get("input_tokens") or 0) + int(usage.get("output_tokens") or 0)
        usd = float(usage.get("cost_usd") or 0.0)
        u = self.unit_spent(unit)
        for s in (self.run, u):
            s.tokens += tokens
            s.usd += usd

    def seed(self, usages) -> None:
        """Count earlier usage records (porter.records.history.Usage) toward per-unit budgets (a resumed run)."""
        for r in usages:
            if r.unit:
                u = self.unit_spent(r.unit)
                u.tokens += int(r.input_tokens or 0) + int(r.output_tokens or 0)
                u.usd += float(r.cost_usd or 0.0)


def usage_record(completion, target: str | None = None, unit: str | None = None) -> dict:
    """Fields of the ledger's "usage" record for one provider call:
    `ledger.append("usage", **usage_record(completion))`.

    `completion` is a Completion, or a ProviderError carrying `.usage` (a call
    that failed after spending tokens is recorded too).  target/unit default
    to what the provider stamped into the usage dict from the request.
    """
    usage = dict(getattr(completion, "usage", None) or {})
    provider = getattr(completion, "provider", None) or usage.get("provider")
    model = getattr(completion, "model", None) or usage.get("model")
    rec = {
        "target": target if target is not None else usage.get("target"),
        "unit": unit if unit is not None else usage.get("unit"),
        "provider": provider,
        "model": model,
        "input_tokens": int(usage.get("input_tokens") or 0),
        "output_tokens": int(usage.get("output_tokens") or 0),
        "cost_usd": usage.get("cost_usd"),
        "calls": int(usage.get("calls") or 0),
    }
    if usage.get("estimated"):
        rec["estimated"] = True
    if isinstance(completion, BaseException):
        rec["error"] = str(completion)
    return rec
