"""Token totals and their cost: the `tokens` projection unit and the price table.

Layer: agent. Usage is recorded once per model request, on the step's `assistant/message`, in the
harness's disjoint `TokenUsage` shape (docs/agent.md#token-usage). The `tokens` unit folds those
usages into a session's totals: the whole session, per model (prices are per model), and the
latest turn. It counts the session's *own* requests: a `session/end-seed` (the end of a fork's
inherited prefix) starts the count again, so a fork never counts the requests of the log it was
copied from and a subagent tree's total is the plain sum of its sessions' totals
(docs/projections.md#tokens-and-titles). The state is plain JSON and small (one counter object
per model), so folding a 300-turn session copies a few dictionaries per step, never a list of turns.

Cost is computed where totals are shown, from the configured price table
(`ModelPrice`, `dsh.Config().prices`): a model without a price shows tokens only, and a total that
mixes priced and unpriced models has no cost (a partial sum would look like the whole).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dsh.agent.model import Usage
from dsh.agent.units import add_counts
from dsh.config import PricesConfig
from dsh.session.events import SessionEvent

__all__ = [
    "ModelPrice",
    "TokenTotals",
    "price_table",
    "totals_from_view",
    "turn_totals",
    "usage_of_event",
]


@dataclass(frozen=True, slots=True)
class ModelPrice:
    """What one model costs, per million tokens, in `currency`.

    Attributes:
        input: Input that was not served from the prompt cache (DeepSeek's "cache miss").
        cache_hit_input: Input read from the prompt cache ("cache hit").
        output: Output tokens (reasoning included).
        cache_write_input: Input written to the prompt cache; None charges it as `input`.
        currency: The currency of the three prices.
    """

    input: float
    cache_hit_input: float
    output: float
    cache_write_input: float | None = None
    currency: str = "USD"

    def cost(self, counters: Mapping[str, int]) -> float:
        """The cost of `counters` (a total's `inputTokens`, `cacheReadTokens`, ...)."""
        write = self.cache_write_input if self.cache_write_input is not None else self.input
        return (
            counters.get("inputTokens", 0) * self.input
            + counters.get("cacheReadTokens", 0) * self.cache_hit_input
            + counters.get("cacheWriteTokens", 0) * write
            + counters.get("outputTokens", 0) * self.output
        ) / 1_000_000


@dataclass(frozen=True, slots=True)
class TokenTotals:
    """A token total (a turn's, a session's or a tree's), with its cost when every model in it is priced.

    Attributes:
        input_tokens: Uncached input tokens.
        output_tokens: Output tokens.
        cache_read_tokens: Input tokens read from the prompt cache.
        cache_write_tokens: Input tokens written to the prompt cache.
        reasoning_tokens: Output tokens spent on reasoning (part of `output_tokens`).
        requests: Model requests that reported usage.
        cost: The cost in `currency`; None when a model of the total has no price.
        currency: The currency of `cost` (None without a cost).
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    requests: int = 0
    cost: float | None = None
    currency: str | None = None

    @property
    def billed_input_tokens(self) -> int:
        """Every input token billed: uncached, cache reads and cache writes."""
        return self.input_tokens + self.cache_read_tokens + self.cache_write_tokens

    @property
    def total_tokens(self) -> int:
        """Billed input plus output."""
        return self.billed_input_tokens + self.output_tokens

    def __add__(self, other: TokenTotals) -> TokenTotals:
        both_priced = self.cost is not None and other.cost is not None and self.currency == other.currency
        empty_self, empty_other = self.requests == 0, other.requests == 0
        cost: float | None
        currency: str | None
        if both_priced:
            cost, currency = (self.cost or 0.0) + (other.cost or 0.0), self.currency
        elif empty_self:
            cost, currency = other.cost, other.currency
        elif empty_other:
            cost, currency = self.cost, self.currency
        else:
            cost, currency = None, None
        return TokenTotals(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
            self.reasoning_tokens + other.reasoning_tokens,
            self.requests + other.requests,
            cost,
            currency,
        )

    def to_json(self) -> dict[str, Any]:
        """The wire form: the five counters, `requests`, and `cost` with `currency` when priced."""
        out: dict[str, Any] = {
            "inputTokens": self.input_tokens,
            "outputTokens": self.output_tokens,
            "cacheReadTokens": self.cache_read_tokens,
            "cacheWriteTokens": self.cache_write_tokens,
            "reasoningTokens": self.reasoning_tokens,
            "requests": self.requests,
        }
        if self.cost is not None:
            out["cost"] = self.cost
            out["currency"] = self.currency
        return out

    def summary(self) -> str:
        """One line: `12,345 tokens (in 10,000 · cached 2,000 · out 345) · $0.0042`."""
        line = (
            f"{self.total_tokens:,} tokens (in {self.input_tokens:,} · cached {self.cache_read_tokens:,}"
            f" · out {self.output_tokens:,})"
        )
        if self.cost is not None:
            symbol = "$" if self.currency == "USD" else f"{self.currency} "
            line += f" · {symbol}{self.cost:.4f}"
        return line


def usage_of_event(event: SessionEvent | Mapping[str, Any]) -> Usage | None:
    """The usage an `assistant/message` or a `compaction/summary` carries (None for others or without usage)."""
    kind = event.type if isinstance(event, SessionEvent) else event.get("type")
    data: Any = event.data if isinstance(event, SessionEvent) else event.get("data")
    if kind not in ("assistant/message", "compaction/summary") or not isinstance(data, Mapping):
        return None
    usage: Any = data.get("usage")
    if not isinstance(usage, Mapping):
        return None
    keys = ("inputTokens", "outputTokens", "cacheReadTokens", "cacheWriteTokens", "reasoningTokens")
    counts: dict[str, Any] = {key: usage.get(key) for key in keys}
    if not all(value is None or (type(value) is int and value >= 0) for value in counts.values()):
        return None
    return Usage(
        counts["inputTokens"] or 0,
        counts["outputTokens"] or 0,
        counts["cacheReadTokens"],
        counts["cacheWriteTokens"],
        counts["reasoningTokens"],
    )


def _priced(counters: Mapping[str, Any], by_model: Mapping[str, Any], prices: Mapping[str, ModelPrice]) -> TokenTotals:
    cost: float | None = 0.0
    currency: str | None = None
    for model, model_counters in by_model.items():
        price = prices.get(model)
        if price is None or (currency is not None and price.currency != currency) or cost is None:
            cost = None
            continue
        currency = price.currency
        cost += price.cost(model_counters)
    if not by_model:
        cost = None
    return TokenTotals(
        int(counters.get("inputTokens", 0)),
        int(counters.get("outputTokens", 0)),
        int(counters.get("cacheReadTokens", 0)),
        int(counters.get("cacheWriteTokens", 0)),
        int(counters.get("reasoningTokens", 0)),
        int(counters.get("requests", 0)),
        cost,
        currency if cost is not None else None,
    )


def totals_from_view(view: object, prices: Mapping[str, ModelPrice]) -> TokenTotals | None:
    """The session total a `tokens` view shows, priced with `prices` (None for a `null` view)."""
    if not isinstance(view, Mapping) or not isinstance(view.get("total"), Mapping):
        return None
    by_model = view.get("byModel")
    return _priced(view["total"], by_model if isinstance(by_model, Mapping) else {}, prices)


def price_table(prices: PricesConfig) -> dict[str, ModelPrice]:
    """The configured price table (`Config().prices`) as model name → `ModelPrice`."""
    return {
        name: ModelPrice(p.input, p.cache_hit_input, p.output, p.cache_write_input, p.currency)
        for name, p in prices.models.items()
    }


def turn_totals(usages: list[tuple[str, Usage]], prices: Mapping[str, ModelPrice]) -> TokenTotals:
    """The total of one turn's `(model, usage)` pairs, priced with `prices`."""
    total: dict[str, int] | None = None
    by_model: dict[str, dict[str, int]] = {}
    for model, usage in usages:
        counts = usage.to_json()
        total = add_counts(total, counts)
        by_model[model] = add_counts(by_model.get(model), counts)
    if total is None:
        return TokenTotals()
    return _priced(total, by_model, prices)
