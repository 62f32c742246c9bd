"""What prompt tokens cost at the cloud providers: a versioned, dated price table, overridable.

US dollars per million tokens, standard tier: base input, cache write (Anthropic's 5-minute and 1-hour
premiums, 1.25x and 2x; OpenAI's newer explicit regime 1.25x), cache read (Anthropic 0.1x, OpenAI per
model), output. Sources, read on the dates given: Anthropic's pricing and prompt-caching pages
(2026-08-21), OpenAI's pricing page, DeepSeek's pricing page (2026-10, off-peak), Gemini's pricing page
as quoted (UNVERIFIED against the page itself). Prices change: the user's config file overrides any
model (`[prices."MODEL"]` with input, write_5m, write_1h, read, output). A model is matched by the
longest table key its name starts with, not across a tier (TIER). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tokendiff.core.cache.cloud import CloudTurn, Provider
from tokendiff.core.plain import replace

PRICES_VERSION = "2026-10-01"  # the date of the newest source the table was read from


@dataclass(frozen=True)
class Price:
    """$ per million tokens."""

    input: float
    read: float  # a cache read
    write_5m: float | None = None  # a cache write, 5-minute lifetime (None: writes cost the input price)
    write_1h: float | None = None
    output: float = 0.0
    source: str = "table " + PRICES_VERSION

    def write(self, one_hour: bool = False) -> float:
        w = self.write_1h if one_hour else self.write_5m
        return w if w is not None else self.input


def _anthropic(base: float, out: float) -> Price:
    # rounded as the provider's page states them (0.3, not 0.30000000000000004)
    return Price(base, round(base * 0.1, 6), round(base * 1.25, 6), round(base * 2.0, 6), out)


TABLE: dict[str, Price] = {
    # Anthropic (prompt-caching page, 2026-08-21)
    "claude-opus-5": _anthropic(5, 25),
    "claude-opus-4-8": _anthropic(5, 25),
    "claude-opus-4-7": _anthropic(5, 25),
    "claude-opus-4-6": _anthropic(5, 25),
    "claude-opus-4-5": _anthropic(5, 25),
    "claude-opus-4-1": _anthropic(15, 75),
    "claude-opus-4": _anthropic(15, 75),
    "claude-sonnet-5": _anthropic(2, 10),
    "claude-sonnet-4": _anthropic(3, 15),
    "claude-haiku-4-5": _anthropic(1, 5),
    "claude-3-5-haiku": _anthropic(0.8, 4),
    "claude-fable-5": _anthropic(10, 50),
    "claude-mythos-5": _anthropic(10, 50),
    # OpenAI (pricing page; cached input, no write charge before GPT-5.6)
    "gpt-4o-mini": Price(0.15, 0.075, output=0.60),
    "gpt-4o": Price(2.50, 1.25, output=10),
    "gpt-4.1-nano": Price(0.10, 0.025, output=0.40),
    "gpt-4.1-mini": Price(0.40, 0.10, output=1.60),
    "gpt-4.1": Price(2.00, 0.50, output=8.00),
    "gpt-5-nano": Price(0.05, 0.005, output=0.40),
    "gpt-5-mini": Price(0.25, 0.025, output=2),
    "gpt-5.1": Price(1.25, 0.125, output=10),
    "gpt-5.2": Price(1.75, 0.175, output=14),
    "gpt-5.4": Price(2.50, 0.25, output=15),
    "gpt-5.5": Price(5, 0.50, output=30),
    "gpt-5.6-sol": Price(4, 0.40, 5.00, 5.00, 20),
    "gpt-5.6-terra": Price(2, 0.20, 2.50, 2.50, 12),
    "gpt-5.6-luna": Price(0.20, 0.02, 0.25, 0.25, 1.20),
    "gpt-5": Price(1.25, 0.125, output=10),
    "o3-mini": Price(1.10, 0.55, output=4.40),
    "o3": Price(2, 0.50, output=8),
    "o4-mini": Price(1.10, 0.275, output=4.40),
    "o1": Price(15, 7.50, output=60),
    # DeepSeek (pricing page, 2026-10, off-peak; a hit is the read, a miss the input)
    "deepseek-flash": Price(0.15, 0.003, output=0.60),
    "deepseek-v4-pro": Price(0.66, 0.022, output=1.98),
    "deepseek-chat": Price(0.27, 0.07, output=1.10),
    # Gemini (as quoted from the pricing page; implicit hits at the cached rate)
    "gemini-2.5-pro": Price(1.25, 0.31, output=10),
    "gemini-2.5-flash": Price(0.30, 0.075, output=2.50),
}


# a tier named after a key's model is another model at another price (gpt-5.1-codex-mini is not gpt-5.1's,
# gemini-2.5-flash-lite not gemini-2.5-flash's): a key covers its snapshots and variants, not those
TIER = re.compile(r"(?:^|[-._])(?:mini|nano|pro|lite|max|deep-research)(?:$|[-._])")


def price_of(model: str, overrides: Mapping[str, Price] | None = None) -> Price | None:
    """The price of a model: the user's override first, then the table (longest matching prefix, no
    other tier: None rather than a wrong price)."""
    m = model.lower()
    for table in (overrides or {}, TABLE):
        keys = [k for k in table if m.startswith(k.lower()) and not TIER.search(m[len(k) :])]
        if keys:
            return table[max(keys, key=len)]
    return None


PRICE_KEYS = ("input", "read", "write_5m", "write_1h", "output")


def parse_overrides(doc: Any, source: str) -> tuple[dict[str, Price], list[str]]:
    """`[prices."MODEL"]` tables of the config file as prices; a warning per bad entry."""
    out: dict[str, Price] = {}
    warnings: list[str] = []
    if not isinstance(doc, dict):
        return out, [f"{source}: prices must be a table of models"]
    for model, v in doc.items():
        if not isinstance(v, dict) or not isinstance(v.get("input"), (int, float)):
            warnings.append(f"{source}: prices.{model} needs at least input = $/MTok")
            continue
        bad = [k for k in v if k not in PRICE_KEYS or not isinstance(v[k], (int, float)) or v[k] < 0]
        if bad:
            warnings.append(f"{source}: prices.{model}: {', '.join(map(str, bad))} ignored (known: {PRICE_KEYS})")
        nums = {k: float(v[k]) for k in PRICE_KEYS if k in v and k not in bad}
        base = price_of(model) or Price(nums["input"], nums["input"])
        out[model] = replace(base, **nums, source=f"{source} prices.{model}")
    return out, warnings


def break_cost(price: Price, waste: int, rewritten: int, rewritten_1h: int = 0) -> float:
    """$ a break cost: tokens written again pay the write price (`rewritten_1h` of them the 1-hour one), the
    rest of the waste the input price, where a hit would have paid the read price for all of them."""
    fresh = max(0, waste - rewritten)
    long = min(rewritten, rewritten_1h)
    written = (rewritten - long) * (price.write() - price.read) + long * (price.write(True) - price.read)
    return (written + fresh * (price.input - price.read)) / 1e6


# ---------------------------------------------------------------- a session priced


DAY = 86400.0
RATE_SPAN_S = 60.0  # the shortest session a day's rate is said of: a shorter one's spacing is no cadence


@dataclass
class PricedTurn:
    """A turn's verdict and what its break cost."""

    turn: CloudTurn
    cost: float | None  # $ the break cost (None: no price for the model)


@dataclass
class CloudReport:
    """A session judged by its provider's rules and priced (app.cloud builds it, report.cloud renders it)."""

    provider: Provider
    model: str
    turns: list[PricedTurn]
    price: Price | None
    duration_s: float | None  # first request to last
    counts: str  # how per-block tokens were counted
    by_cause: dict[str, tuple[int, float | None]] = field(default_factory=dict)  # cause -> (tokens, $)
    providers: tuple[Provider, ...] = ()  # every provider the session was sent to, `provider` first

    @property
    def wasted_tokens(self) -> int:
        return sum(p.turn.waste for p in self.turns)

    @property
    def wasted_cost(self) -> float | None:
        costs = [p.cost for p in self.turns if p.turn.waste]
        return None if any(c is None for c in costs) else sum(c for c in costs if c is not None)

    def by_turn(self) -> dict[int, PricedTurn]:
        """The turns the provider judged, by the session's turn number (from 1)."""
        return {p.turn.turn: p for p in self.turns}

    def turn_costs(self) -> dict[int, float]:
        """$ each break cost, by the session's turn number (the turns that broke, where the model has a price)."""
        return {p.turn.turn: p.cost for p in self.turns if p.turn.waste and p.cost is not None}

    def cost_of(self, turns: Iterable[int]) -> float | None:
        """$ the breaks of these turns cost at the provider (None: the model has no price)."""
        wanted = set(turns)
        costs = [p.cost for p in self.turns if p.turn.turn in wanted and p.turn.waste]
        return None if any(c is None for c in costs) else sum(c for c in costs if c is not None)

    def per_day(self, cost: float | None) -> float | None:
        """`cost` at the session's rate: what it amounts to over a day of sessions like this one. None for a
        session shorter than RATE_SPAN_S (two requests 0.1 s apart made a cent thousands of dollars a day)."""
        if cost is None or self.duration_s is None or self.duration_s < RATE_SPAN_S:
            return None
        return cost * DAY / self.duration_s
