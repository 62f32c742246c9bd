"""The cloud providers' prompt-cache rules as a model, and a verdict per turn.

A cloud cache is not a slot: each provider keeps prefixes by its own rules, and a break costs money.

- **Anthropic** (platform.claude.com/docs/en/build-with-claude/prompt-caching): the prefix is tools ->
  system -> messages, cut into blocks; an entry is written only at a `cache_control` breakpoint (at most
  4; a top-level `cache_control` puts one on the last block), and only when the prefix up to it reaches
  the model's minimum; a request reads the longest entry found at a breakpoint or up to 20 blocks before
  it (the lookback window); an entry lives 5 minutes (or 1 hour), refreshed by each read.
- **OpenAI** (developers.openai.com/api/docs/guides/prompt-caching): before GPT-5.6, automatic from
  1,024 tokens, reported in 128-token steps; requests are routed by a hash of the prompt's start and
  `prompt_cache_key`, so a new key lands on a machine without the prefix; `in_memory` retention keeps a
  prefix 5-10 idle minutes (at most an hour), `24h` typically about 30 minutes (at most a day), which is the
  default where a model has both (in_memory for an organisation with Zero Data Retention) and the only one
  of GPT-5.5. From GPT-5.6, entries at breakpoints: in the
  default implicit mode the end of each user message, of each run of tool outputs and of the initial
  developer block, plus the content blocks marked `prompt_cache_breakpoint: {"mode": "explicit"}` (the
  only ones with `prompt_cache_options.mode: "explicit"`); at most 4 written a request, looked up at the
  first 2 and latest 50 explicit ones and the latest 20 message ends; `prompt_cache_options.ttl` (30m).
- **Gemini** (ai.google.dev/gemini-api/docs/caching): implicit caching above a per-model minimum, no
  guaranteed lifetime; an explicit cached content (`POST cachedContents` with a `ttl` or `expireTime`)
  is read whole by each request naming it (`cachedContent`) until it expires (no read refreshes it).
- **DeepSeek** (api-docs.deepseek.com/guides/kv_cache): a hit needs a whole stored prefix unit: the end
  of each earlier request's prompt, or a common prefix found when two requests parted.

The verdict of a turn names why it read less than the previous turn had cached: the content (the first
divergent block and field), the lifetime (the idle gap), the minimum, the routing key, the model, or
Anthropic's lookback window. Token counts per block are estimates scaled to the provider's own count,
which is the truth for accounting. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from tokendiff.core.jsontext import valid_text
from tokendiff.core.kinds import CloudCause
from tokendiff.core.plain import replace
from tokendiff.core.usage import Usage, usage_of


class Provider(StrEnum):
    ANTHROPIC = "anthropic"
    OPENAI = "openai"
    GEMINI = "gemini"
    DEEPSEEK = "deepseek"


LOOKBACK_BLOCKS = 20
MAX_BREAKPOINTS = 4
TTL = {"5m": 300.0, "1h": 3600.0, "30m": 1800.0, "12h": 43200.0}  # Anthropic's; OpenAI's from GPT-5.6
OPENAI_LOOKUP = (2, 50, 21)  # GPT-5.6+ looks up the first 2 and latest 50 explicit breakpoints, the latest message
# end and 20 before it
GEMINI_EXPLICIT_TTL = 3600.0  # a cached content made before the session: its documented default TTL
OPENAI_STEP = 128
OPENAI_MINIMUM = 1024
OPENAI_RETENTION = {"in_memory": 600.0, "24h": 86400.0}  # in memory: 5-10 idle minutes; the upper bound
OPENAI_24H_TYPICAL = 1800.0  # `24h` "typically keeps entries available for around 30 minutes"
# prompt_cache_retention per model before GPT-5.6 (the prompt-caching guide's "Cache lifetime" and model table):
# GPT-5.5 keeps 24h only; these have both, and default to 24h (in_memory for an organisation with Zero Data
# Retention); every other model has in_memory only
OPENAI_24H_ONLY = ("gpt-5.5", "gpt-5.5-pro")
OPENAI_EXTENDED = (
    *OPENAI_24H_ONLY,
    *("gpt-5.4", "gpt-5.2", "gpt-5.1-codex-max", "gpt-5.1", "gpt-5.1-codex", "gpt-5.1-codex-mini"),
    *("gpt-5.1-chat-latest", "gpt-5", "gpt-5-codex", "gpt-4.1"),
)
DEEPSEEK_LIFETIME = 6 * 3600.0  # "a few hours to a few days": a gap past this may have lost the unit

# minimum cacheable prefix, by model name prefix (Anthropic prompt-caching page, 2026-08-21; Gemini caching page
# 2026-07); the first that matches wins
ANTHROPIC_MINIMUM = (
    ("claude-opus-5", 512),
    ("claude-fable-5", 512),
    ("claude-mythos-5", 512),
    ("claude-mythos", 2048),
    ("claude-opus-4-7", 2048),
    ("claude-3-5-haiku", 2048),
    ("claude-haiku-3-5", 2048),
    ("claude-3-haiku", 2048),  # Haiku 3, as Haiku 3.5
    ("claude-opus-4-6", 4096),
    ("claude-opus-4-5", 4096),
    ("claude-haiku-4-5", 4096),
    ("claude", 1024),
)
GEMINI_MINIMUM = (("gemini-3", 4096), ("gemini-2.5", 2048), ("gemini", 4096))


class Retention(StrEnum):
    """How an OpenAI request's prompt_cache_retention came to be (the guide's defaults)."""

    ASKED = "asked"  # the request's own prompt_cache_retention
    ONLY = "only"  # the only one the model supports
    DEFAULT = "default"  # the model's default: 24h, or in_memory for an organisation with Zero Data Retention


def openai_retention(model: str, asked: str | None) -> tuple[str, Retention]:
    """The retention an OpenAI request before GPT-5.6 gets, and why: GPT-5.5's 24h whatever it asks; what
    it asks; else 24h on a model that has it (the default without Zero Data Retention), in_memory on others."""
    base = re.sub(r"-\d{4}-\d{2}-\d{2}$", "", model.lower())  # a dated snapshot is its model's
    if base in OPENAI_24H_ONLY:
        return "24h", Retention.ONLY
    if asked in OPENAI_RETENTION:
        return asked, Retention.ASKED
    if base in OPENAI_EXTENDED:
        return "24h", Retention.DEFAULT
    return "in_memory", Retention.ONLY


def minimum_tokens(provider: Provider, model: str) -> int:
    """The shortest prefix the provider caches for this model."""
    table = {Provider.ANTHROPIC: ANTHROPIC_MINIMUM, Provider.GEMINI: GEMINI_MINIMUM}.get(provider)
    if table is None:
        return OPENAI_MINIMUM if provider == Provider.OPENAI else 0
    m = model.lower()
    return next((n for prefix, n in table if m.startswith(prefix)), table[-1][1])


@dataclass(frozen=True)
class Block:
    """One cacheable unit of a request, in prefix order."""

    field: str  # the request field, e.g. tools[2], system[0], messages[4].content[1]
    text: str  # its content as the provider hashes it (canonical JSON of the block)
    breakpoint: str | None = None  # "5m" or "1h" where the block carries cache_control
    visible: str = ""  # what the model reads of it (its strings, not the JSON around them); "": the text
    explicit: bool = False  # OpenAI: the breakpoint is marked in the request (else a message end, implicit)
    thinking: bool = False  # Anthropic: an assistant's thinking block (some models strip the earlier turns')
    history: bool = False  # a conversation turn, not tools, system prompt or settings (what a compaction replaces)

    @property
    def read(self) -> str:
        """The text a tokenizer counts: what the model reads where known, else the block's JSON (a lone
        UTF-16 surrogate, which a string cut mid-emoji leaves and no tokenizer takes, as U+FFFD)."""
        text = self.visible or self.text
        return valid_text(text)


class CloudTokenizer(StrEnum):
    """The providers' tokenizers tokendiff ships (tokendiff/data/README.md: origin, licence)."""

    O200K = "o200k_base"  # OpenAI's, for GPT-4o, GPT-4.1, GPT-5 and the o-series (tiktoken)
    DEEPSEEK_V3 = "deepseek-v3"  # DeepSeek-V3's (also V3-0324, R1, and behind deepseek-chat / -reasoner)


# which shipped tokenizer counts a model's prompt: (provider, model name prefixes, tokenizer, the model's own)
TOKENIZERS = (
    (Provider.OPENAI, ("gpt-4o", "chatgpt-4o", "gpt-4.1", "gpt-4.5", "gpt-5", "o1", "o3", "o4", "codex"), True),
    (Provider.DEEPSEEK, ("deepseek-chat", "deepseek-reasoner", "deepseek-v3", "deepseek-r1"), True),
    (Provider.DEEPSEEK, ("deepseek",), False),  # a newer model: DeepSeek-V3's is the nearest published
)
TOKENIZER_OF = {Provider.OPENAI: CloudTokenizer.O200K, Provider.DEEPSEEK: CloudTokenizer.DEEPSEEK_V3}


def tokenizer_for(provider: Provider, model: str) -> tuple[CloudTokenizer, bool] | None:
    """The shipped tokenizer for a model's prompts, and whether it is the model's own (else the nearest);
    None where none is public (Claude, Gemini) or shipped (OpenAI's older cl100k models)."""
    m = model.lower()
    for p, prefixes, own in TOKENIZERS:
        if p == provider and m.startswith(prefixes):
            return TOKENIZER_OF[p], own
    return None


@dataclass(frozen=True)
class ExplicitCache:
    """A Gemini cached content: its name, its tokens, when it expires (seconds)."""

    name: str
    tokens: int
    expires: float


@dataclass(frozen=True)
class CloudRequest:
    """A recorded request as the cache model reads it."""

    provider: Provider
    model: str
    blocks: tuple[Block, ...]
    usage: Usage
    t: float | None = None  # when it was sent (seconds)
    key: str | None = None  # OpenAI prompt_cache_key
    retention: str | None = None  # OpenAI prompt_cache_retention
    diagnostics: Any = None  # the provider's own: Anthropic `diagnostics`, OpenAI `prompt_cache_diagnostics`
    breakpoints: bool = False  # OpenAI from GPT-5.6: entries at the blocks' breakpoints, as Anthropic's
    cached_content: str | None = None  # Gemini: the explicit cache the request names (`cachedContent`)
    creates: ExplicitCache | None = None  # Gemini: the request made this cached content (`POST cachedContents`)
    failed: str | None = None  # the error the provider answered instead of counting the prompt (`overloaded_error`)
    partial: bool = False  # the body holds only part of the prompt (Gemini's cachedContent, previous_response_id)


@dataclass
class CloudTurn:
    """One turn's verdict."""

    turn: int
    cause: CloudCause
    prompt: int  # tokens, as the provider counted them
    read: int | None  # cache read, as reported
    written: int | None  # cache written, as reported (Anthropic; OpenAI's newer models)
    predicted: int  # what the rules give this turn
    waste: int = 0  # tokens the previous turn had cached that this one paid for again
    rewritten: int = 0  # of which written to the cache again (Anthropic: at the write premium)
    field: str = ""  # the first divergent block's field (content)
    excerpt: str = ""  # where it diverged, a few characters each side
    token: str = ""  # the first divergent token, where the tokenizer is public
    idle_s: float | None = None  # the gap since the entry was last used (expiry)
    detail: str = ""  # the sentence a report prints
    provider_reason: str = ""  # the provider's own diagnosis, when the session asked for it
    agrees: bool | None = None  # whether it names the same cause
    estimated: bool = True  # per-block counts are estimates (the totals are the provider's)
    record: int = 0  # the record it was judged from, from 1 in its file (`turn` may be the analysis's numbering)


Counter = Callable[[str], int]


def approx_tokens(text: str) -> int:
    """About 4 bytes a token: the estimate where the provider's tokenizer is not public (Claude)."""
    return max(1, (len(text.encode("utf-8", "surrogatepass")) + 3) // 4)


@dataclass
class _Entry:
    expires: float
    tokens: int


MAX_LANES = 8  # conversations followed at once (a main agent, its sub-agents, side requests)


@dataclass(frozen=True)
class _Lane:
    """A conversation's last request, as CloudModel judges the next one against it."""

    prev: CloudRequest | None  # None: none yet
    cum: list[int]
    extent: int
    last_t: float | None


def _shared_blocks(a: CloudRequest, b: CloudRequest) -> int:
    """How many leading blocks two requests share."""
    d = _first_divergent(a, b)
    return min(len(a.blocks), len(b.blocks)) if d is None else d


@dataclass
class CloudModel:
    """Feed requests in order with `add`; each gives its turn's verdict."""

    count: Counter = approx_tokens
    exact_counts: bool = False  # `count` is the provider's own tokenizer
    pieces: Callable[[str], list[str]] | None = None  # the tokenizer's pieces, for the divergent token
    turns: list[CloudTurn] = field(default_factory=list)
    _prev: CloudRequest | None = None
    _prev_cum: list[int] = field(default_factory=list)
    _prev_extent: int = 0  # tokens the previous request left cached (read or written)
    _entries: dict[str, _Entry] = field(default_factory=dict)  # prefix hash -> entry (Anthropic, DeepSeek)
    _explicit: dict[str, _Entry] = field(default_factory=dict)  # Gemini's cached contents, by name
    _last_t: float | None = None
    _lanes: list[_Lane] = field(default_factory=list)  # the other conversations' last requests, latest first

    def add(self, req: CloudRequest) -> CloudTurn:
        cum = self._cumulative(req)
        hashes = _prefix_hashes(req)
        t = req.t if req.t is not None else (self._last_t or 0.0)
        if req.creates is not None:  # not a turn of the conversation: it makes the cache the next ones name
            return self._created(req, cum)
        if req.failed is not None and not self._gone(req, t):  # the cache did not see it: the next turn is
            return self._refused(req)  # judged against the one before
        self._follow(req)
        rules = {
            Provider.ANTHROPIC: self._anthropic,
            Provider.OPENAI: self._at_openai_breakpoints if req.breakpoints else self._implicit,
            Provider.GEMINI: self._gemini,
            Provider.DEEPSEEK: self._deepseek,
        }[req.provider]
        predicted, free, extent = rules(req, cum, hashes, t)
        turn = self._verdict(req, cum, predicted, free, t)
        _compare_diagnostics(turn, req)
        self.turns.append(turn)
        self._prev, self._prev_cum, self._last_t = req, cum, t
        self._prev_extent = _reported_extent(req, extent)
        return turn

    def _follow(self, req: CloudRequest) -> None:
        """Take up the conversation this request continues: caches are per prefix and per model, so a side
        request (Claude Code's to Haiku, a title, a summary) or a sub-agent keeps its own, and the main
        one's next turn is judged against the main one's last. It is the recent request sharing the most
        leading blocks with it (whatever its model: sharing them at another model is a model change), else
        the latest to its model; none: the request starts a conversation."""
        lanes = [_Lane(self._prev, self._prev_cum, self._prev_extent, self._last_t)] if self._prev is not None else []
        lanes += self._lanes
        shared = [_shared_blocks(lane.prev, req) if lane.prev is not None else 0 for lane in lanes]
        k: int | None = None
        if any(shared):
            k = max(range(len(lanes)), key=lambda i: (shared[i], -i))  # the latest of those sharing the most
        else:
            k = next((i for i, lane in enumerate(lanes) if lane.prev and not _model_changed(lane.prev, req)), None)
        chosen = _Lane(None, [], 0, None) if k is None else lanes[k]
        if k is not None and chosen.prev is not None and shared[k] >= len(chosen.prev.blocks):
            lanes.pop(k)  # continued whole: this request is that conversation's last now (else a fork: both kept)
        self._lanes = lanes[: MAX_LANES - 1]
        self._prev, self._prev_cum, self._prev_extent, self._last_t = (
            chosen.prev,
            chosen.cum,
            chosen.extent,
            chosen.last_t,
        )

    def unread(self, req: CloudRequest) -> None:
        """A turn whose body cannot be read (not stored, its blob lost): not judged, but what its answer
        says it left cached is what the next turn can waste, from its time on."""
        if self._prev is not None and req.failed is None:
            self._prev_extent = _reported_extent(req, self._prev_extent)
            self._last_t = req.t if req.t is not None else self._last_t

    # ------------------------------------------------------------ the rules

    def _cumulative(self, req: CloudRequest) -> list[int]:
        """Tokens up to the end of each block, the last being the provider's prompt count. An estimate is
        scaled to it; the provider's own tokenizer's counts are kept, and what the provider counted beyond
        them (the template's markers, its hidden tokens) shared equally among the blocks."""
        raw = [self.count(b.read) for b in req.blocks]
        total, prompt = sum(raw), req.usage.prompt
        extra = (prompt - total) / len(raw) if raw and prompt and self.exact_counts and prompt >= total else None
        scale = prompt / total if prompt and total and extra is None else 1.0
        out, acc = [], 0.0
        for n in raw:
            acc += n * scale + (extra or 0.0)
            out.append(int(round(acc)))
        return out

    def _anthropic(self, req: CloudRequest, cum: list[int], hashes: list[str], t: float) -> tuple[int, int, int]:
        """Entries are read at a breakpoint or up to 20 blocks before it (the first found); written at each
        of the last 4 breakpoints whose prefix reaches the minimum."""
        bps = [i for i, b in enumerate(req.blocks) if b.breakpoint][-MAX_BREAKPOINTS:]
        found = []
        for bp in bps:
            j = next((j for j in range(bp, max(-1, bp - LOOKBACK_BLOCKS), -1) if hashes[j] in self._entries), None)
            found += [j] if j is not None else []
        return self._at_breakpoints(req, cum, hashes, t, found, bps)

    def _at_openai_breakpoints(
        self, req: CloudRequest, cum: list[int], hashes: list[str], t: float
    ) -> tuple[int, int, int]:
        """GPT-5.6 and later: entries looked up at the first 2 and latest 50 explicit breakpoints and the
        latest 20 message ends; written at the last 4 breakpoints whose prefix reaches the minimum."""
        first, latest, ends = OPENAI_LOOKUP
        explicit = [i for i, b in enumerate(req.blocks) if b.breakpoint and b.explicit]
        implicit = [i for i, b in enumerate(req.blocks) if b.breakpoint and not b.explicit]
        lookup = sorted({*explicit[:first], *explicit[-latest:], *implicit[-ends:]})
        bps = [i for i, b in enumerate(req.blocks) if b.breakpoint][-MAX_BREAKPOINTS:]
        return self._at_breakpoints(req, cum, hashes, t, lookup, bps)

    def _at_breakpoints(
        self, req: CloudRequest, cum: list[int], hashes: list[str], t: float, lookup: list[int], bps: list[int]
    ) -> tuple[int, int, int]:
        """(read, read had nothing expired, tokens left cached): the longest entry at a `lookup` position;
        a read refreshes the entries on its prefix; entries written at `bps` whose prefix reaches the minimum."""
        live = free = -1
        for j in lookup:
            e = self._entries.get(hashes[j])
            if e is None:
                continue
            free = max(free, j)
            if e.expires >= t:
                live = max(live, j)
        minimum = minimum_tokens(req.provider, req.model)
        for j in range(live + 1):  # a read refreshes every entry on the prefix it read
            if hashes[j] in self._entries and self._entries[hashes[j]].expires >= t:
                self._entries[hashes[j]].expires = t + TTL.get(req.blocks[j].breakpoint or "5m", 300.0)
        for bp in bps:
            if cum[bp] >= minimum:
                ttl = TTL.get(req.blocks[bp].breakpoint or "5m", 300.0)
                self._entries[hashes[bp]] = _Entry(t + ttl, cum[bp])
        written = [cum[bp] for bp in bps if cum[bp] >= minimum]
        read = cum[live] if live >= 0 else 0
        return read, cum[free] if free >= 0 else 0, max([read, *written])

    def _implicit(self, req: CloudRequest, cum: list[int], hashes: list[str], t: float) -> tuple[int, int, int]:
        """OpenAI and Gemini: the common prefix with the previous request, from the minimum, in OpenAI's
        128-token steps; nothing across a routing key or model change, or past the retention."""
        prev = self._prev
        if prev is None or _model_changed(prev, req) or (req.provider == Provider.OPENAI and prev.key != req.key):
            return 0, 0, cum[-1] if cum else 0
        common = _common_tokens(prev, self._prev_cum, req, cum, self.count)
        minimum = minimum_tokens(req.provider, req.model)
        free = 0 if common < minimum else common
        if req.provider == Provider.OPENAI:
            free = free // OPENAI_STEP * OPENAI_STEP
        retention = openai_retention(req.model, req.retention)[0]
        limit = OPENAI_RETENTION[retention] if req.provider == Provider.OPENAI else None
        gap = t - (self._last_t if self._last_t is not None else t)
        live = free if limit is None or gap <= limit else 0
        return live, free, cum[-1] if cum else 0

    def _gemini(self, req: CloudRequest, cum: list[int], hashes: list[str], t: float) -> tuple[int, int, int]:
        """A request naming a cached content reads all of it while it lives (reads do not extend it); one
        made before the session is known by what its first request read. Else implicit caching."""
        name = req.cached_content
        if name is None:
            return self._implicit(req, cum, hashes, t)
        c = self._explicit.get(name)
        if c is None:
            c = self._explicit[name] = _Entry(t + GEMINI_EXPLICIT_TTL, req.usage.cached or 0)
        live = c.tokens if t <= c.expires else 0
        return live, c.tokens, live

    def _created(self, req: CloudRequest, cum: list[int]) -> CloudTurn:
        """`POST cachedContents`: the cache its later requests read, written whole at the input price."""
        c = req.creates
        assert c is not None
        tokens = c.tokens or (cum[-1] if cum else 0)
        self._explicit[c.name] = _Entry(c.expires, tokens)
        made = f"{c.name} created: {tokens:,} tokens stored for {_duration(c.expires - (req.t or 0.0))}"
        turn = CloudTurn(len(self.turns) + 1, CloudCause.COLD, tokens, None, tokens, 0, detail=made)
        turn.estimated = not self.exact_counts
        self.turns.append(turn)
        return turn

    def _gone(self, req: CloudRequest, t: float) -> bool:
        """Whether the cached content a request names had expired: Gemini refuses it (403, not found), and
        the verdict is that expiry."""
        c = self._explicit.get(req.cached_content) if req.cached_content else None
        return c is not None and t > c.expires

    def _refused(self, req: CloudRequest) -> CloudTurn:
        """An error answer without counts: nothing read, written or refreshed (the idle gap runs on)."""
        detail = f"the provider answered {req.failed}: nothing read or written"
        turn = CloudTurn(len(self.turns) + 1, CloudCause.FAILED, req.usage.prompt or 0, None, None, 0, detail=detail)
        turn.estimated = not self.exact_counts
        self.turns.append(turn)
        return turn

    def _deepseek(self, req: CloudRequest, cum: list[int], hashes: list[str], t: float) -> tuple[int, int, int]:
        """A whole stored unit: the longest earlier prompt end (or common prefix) this prompt starts with."""
        found = -1
        for j in range(len(hashes) - 1, -1, -1):
            if hashes[j] in self._entries:
                found = j
                break
        free = cum[found] if found >= 0 else 0
        gap = t - (self._last_t if self._last_t is not None else t)
        live = free if gap <= DEEPSEEK_LIFETIME else 0
        if self._prev is not None:  # where the two parted is persisted too
            d = _first_divergent(self._prev, req)
            if d is not None and d > 0:
                self._entries.setdefault(hashes[d - 1], _Entry(float("inf"), cum[d - 1]))
        if hashes:
            self._entries[hashes[-1]] = _Entry(float("inf"), cum[-1])
        return live, free, cum[-1] if cum else 0

    # ------------------------------------------------------------ the verdict

    def _verdict(self, req: CloudRequest, cum: list[int], predicted: int, free: int, t: float) -> CloudTurn:
        u = req.usage
        prompt = u.prompt if u.prompt is not None else (cum[-1] if cum else 0) + self._named_tokens(req)
        turn = CloudTurn(len(self.turns) + 1, CloudCause.HIT, prompt, u.cached, u.written, predicted)
        turn.estimated = not self.exact_counts
        read = u.cached if u.cached is not None else predicted
        prev = self._prev
        if prev is None:
            return self._first_verdict(turn, req, cum, predicted)
        d = _first_divergent(prev, req)
        turn.waste, replaced = self._waste(prev, req, cum, d, prompt, read)
        turn.rewritten = min(turn.waste, u.written or 0)
        gap = t - (self._last_t if self._last_t is not None else t)
        if d is not None:
            turn.field = req.blocks[d].field if d < len(req.blocks) else prev.blocks[d].field
            turn.excerpt, turn.token = _excerpt(prev, req, d, self.pieces)
        if _model_changed(prev, req):
            turn.cause, turn.detail = CloudCause.MODEL_CHANGED, f"the model changed ({prev.model} -> {req.model})"
        elif req.provider == Provider.OPENAI and prev.key != req.key:
            turn.cause = CloudCause.KEY_CHANGED
            turn.detail = f"prompt_cache_key changed ({prev.key!r} -> {req.key!r}): routed where the prefix is not"
        elif turn.waste == 0:
            turn.cause = CloudCause.HIT
            turn.detail = _hit_detail(turn, d, prev, replaced)
        elif prev.cached_content and req.cached_content != prev.cached_content:
            turn.cause, turn.field = CloudCause.CONTENT, "cachedContent"
            now = req.cached_content or "no cached content"
            turn.detail = f"the request names {now}, not {prev.cached_content}: what that one held is paid again"
        elif free > predicted:
            turn.cause, turn.idle_s = CloudCause.EXPIRED, gap
            turn.detail = self._expired(req, gap, t)
        elif not self._cacheable(req, cum):
            turn.cause, turn.detail = CloudCause.BELOW_MINIMUM, _below(req, cum)
        elif d is not None and (self._prev_cum[d - 1] if 0 < d <= len(self._prev_cum) else 0) < self._prev_extent:
            turn.cause = CloudCause.CONTENT
            _content_detail(turn, prev, req, d)
        elif gap > _typical_lifetime(req):
            turn.cause, turn.idle_s = CloudCause.EXPIRED, gap
            turn.detail = f"idle {_duration(gap)}: longer than the cache typically keeps an entry ({_lifetime(req)})"
        elif req.provider == Provider.ANTHROPIC and predicted < self._prev_extent:
            turn.cause = CloudCause.LOOKBACK
            turn.detail = f"more than {LOOKBACK_BLOCKS} blocks after the last cached entry: add a breakpoint"
        else:
            turn.cause = CloudCause.UNEXPLAINED
            turn.detail = "the provider read less than its rules allow (eviction, or overflow routing)"
        return turn

    def _waste(
        self, prev: CloudRequest, req: CloudRequest, cum: list[int], d: int | None, prompt: int, read: int
    ) -> tuple[int, bool]:
        """What the previous turn had cached and this one paid for again, and whether that is less than all it
        cached because the content from the first divergent block on is new (a compaction: only the blocks
        before it could have been needed again)."""
        full = max(0, min(self._prev_extent, prompt) - read)
        if d is None or not full or not _replaced(prev, req, d):
            return full, False
        before = cum[d - 1] if 0 < d <= len(cum) else 0  # the shared blocks, as this request's count places them
        return max(0, min(self._prev_extent, before, prompt) - read), True

    def _first_verdict(self, turn: CloudTurn, req: CloudRequest, cum: list[int], predicted: int) -> CloudTurn:
        """The session's first request: read whole from an explicit cache it names, else written (or below
        the minimum, and then not cached at all)."""
        if req.cached_content is not None and predicted:
            turn.detail = f"read {req.cached_content} whole ({predicted:,} tokens)"
            return turn
        turn.cause = CloudCause.COLD if self._cacheable(req, cum) else CloudCause.BELOW_MINIMUM
        turn.detail = _below(req, cum) if turn.cause == CloudCause.BELOW_MINIMUM else "first request: written"
        return turn

    def _named_tokens(self, req: CloudRequest) -> int:
        """The tokens of the cached content a request names (part of its prompt, though not in its body)."""
        c = self._explicit.get(req.cached_content) if req.cached_content else None
        return c.tokens if c is not None else 0

    def _expired(self, req: CloudRequest, gap: float, t: float) -> str:
        """Why the entry was gone: the idle gap past its lifetime; a cached content's fixed TTL."""
        c = self._explicit.get(req.cached_content) if req.cached_content else None
        if c is not None:
            return f"{req.cached_content} expired {_duration(t - c.expires)} ago: its TTL runs from its creation"
        return f"idle {_duration(gap)}: longer than the cache's lifetime ({_lifetime(req)})"

    def _cacheable(self, req: CloudRequest, cum: list[int]) -> bool:
        minimum = minimum_tokens(req.provider, req.model)
        if req.cached_content is not None:  # the cached content was made: it passed the minimum then
            return True
        if req.provider == Provider.ANTHROPIC or req.breakpoints:
            bps = [i for i, b in enumerate(req.blocks) if b.breakpoint]
            return any(cum[bp] >= minimum for bp in bps)
        return bool(cum) and cum[-1] >= minimum


def _model_changed(prev: CloudRequest, req: CloudRequest) -> bool:
    """Another model (a request that does not say, such as an error's, is no change: Gemini names the
    model in the URL, and only a success's `modelVersion` in the answer)."""
    return bool(prev.model and req.model) and prev.model != req.model


def _reported_extent(req: CloudRequest, modelled: int) -> int:
    """What this request leaves cached, as the provider counts it: Anthropic's read + written; OpenAI's
    prompt in 128-token steps from the minimum; Gemini's from its minimum; DeepSeek's whole prompt."""
    u = req.usage
    if (req.provider == Provider.ANTHROPIC or req.breakpoints) and (u.cached is not None or u.written is not None):
        return (u.cached or 0) + (u.written or 0)
    if req.cached_content is not None:  # Gemini: the cached content, while it lives
        return u.cached if u.cached is not None else modelled
    if u.prompt is None:
        return modelled
    if u.prompt < minimum_tokens(req.provider, req.model):
        return 0
    return u.prompt // OPENAI_STEP * OPENAI_STEP if req.provider == Provider.OPENAI else u.prompt


def _content_detail(turn: CloudTurn, prev: CloudRequest, req: CloudRequest, d: int) -> None:
    """A content break's field and sentence: the block that changed, or the thinking blocks the provider
    stripped (the first of them)."""
    turn.detail = f"{turn.field} changed before the cached prefix's end: everything after it written again"
    if d < len(prev.blocks) and prev.blocks[d].thinking and not any(b.thinking for b in req.blocks):
        turn.field = prev.blocks[d].field
        turn.detail = (
            f"{req.model} strips earlier thinking blocks at a user turn that is not tool results: "
            f"the cache from {turn.field} on is written again"
        )


def _below(req: CloudRequest, cum: list[int]) -> str:
    minimum = minimum_tokens(req.provider, req.model)
    return f"the prefix ({cum[-1] if cum else 0:,} tokens) is below {req.model}'s minimum of {minimum:,}: never cached"


def _replaced(prev: CloudRequest, req: CloudRequest, d: int | None) -> bool:
    """Whether the conversation's turns from the first divergent block on are new (a compaction's summary,
    another conversation): no block of them was in the previous request. A changed tool, system prompt or
    setting is not: the cache after it is paid again whatever follows (today's date in a system prompt).
    Not known for a request whose body is not its whole prompt (Gemini's cachedContent, a Responses
    continuation)."""
    if d is None or d >= len(req.blocks) or d >= len(prev.blocks) or req.partial or prev.partial:
        return False
    if not (req.blocks[d].history and prev.blocks[d].history):
        return False
    before = {b.text for b in prev.blocks[d:]}
    return not any(b.text in before for b in req.blocks[d:])


def _hit_detail(turn: CloudTurn, d: int | None, prev: CloudRequest, replaced: bool) -> str:
    if replaced:
        return (
            f"new content from {turn.field} on (history replaced: a compaction, another conversation): "
            "nothing cached was needed again"
        )
    if d is not None and d < len(prev.blocks):
        return f"{turn.field} changed after the cached prefix: nothing lost"
    return "read all the previous turn cached"


def _lifetime(req: CloudRequest) -> str:
    if req.provider == Provider.ANTHROPIC or req.breakpoints:
        ttls = {b.breakpoint for b in req.blocks if b.breakpoint}
        return " / ".join(sorted(ttls)) or ("30m" if req.breakpoints else "5m")
    if req.provider == Provider.OPENAI:
        retention, why = openai_retention(req.model, req.retention)
        kept = "typically about 30 minutes, at most 24 hours" if retention == "24h" else "5-10 idle minutes"
        if why == Retention.DEFAULT:
            return f"24h by default ({kept}); in_memory (5-10 idle minutes) with Zero Data Retention"
        only = f", the only retention {req.model} has" if why == Retention.ONLY else ""
        return f"{retention}, {kept}{only}"
    return "hours"


def _typical_lifetime(req: CloudRequest) -> float:
    """How long OpenAI's implicit cache typically keeps an entry (a miss after it is likely an expiry, though
    the rules' bound still held): 24h retention about 30 minutes; where 24h is only the default, 10 minutes
    (in_memory's, an organisation with Zero Data Retention's default). Unbounded elsewhere."""
    if req.provider != Provider.OPENAI or req.breakpoints:
        return float("inf")
    retention, why = openai_retention(req.model, req.retention)
    if retention != "24h":
        return float("inf")
    return OPENAI_RETENTION["in_memory"] if why == Retention.DEFAULT else OPENAI_24H_TYPICAL


def _duration(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    return f"{int(s // 60)} min {int(s % 60)} s" if s >= 60 else f"{s:.0f} s"


def _prefix_hashes(req: CloudRequest) -> list[str]:
    """A hash of the prefix up to each block, per model (caches are never shared across models)."""
    h = hashlib.sha256(req.model.encode())
    out = []
    for b in req.blocks:
        h.update(b"\x00" + b.text.encode("utf-8", "surrogatepass"))
        out.append(h.copy().hexdigest())
    return out


def _first_divergent(a: CloudRequest, b: CloudRequest) -> int | None:
    """The first block that differs (None: b starts with all of a)."""
    for i, (x, y) in enumerate(zip(a.blocks, b.blocks)):
        if x.text != y.text:
            return i
    return None if len(b.blocks) >= len(a.blocks) else len(b.blocks)


def _common_tokens(a: CloudRequest, a_cum: list[int], b: CloudRequest, b_cum: list[int], count: Counter) -> int:
    """The tokens two requests share from the start: whole blocks, then the divergent block's common text."""
    d = _first_divergent(a, b)
    if d is None:
        return a_cum[-1] if a_cum else 0
    before = b_cum[d - 1] if d > 0 else 0
    if d >= len(a.blocks) or d >= len(b.blocks):
        return before
    x, y = a.blocks[d].read, b.blocks[d].read
    n = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
    own = b_cum[d] - before
    share = count(y[:n]) / max(1, count(y)) if n else 0.0
    return before + int(own * share)


def _excerpt(a: CloudRequest, b: CloudRequest, d: int, pieces: Callable[[str], list[str]] | None) -> tuple[str, str]:
    """A few characters each side of the first divergent character of block d, and the first divergent
    token where the tokenizer is known."""
    x = a.blocks[d].text if d < len(a.blocks) else ""
    y = b.blocks[d].text if d < len(b.blocks) else ""
    n = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
    excerpt = f"{y[max(0, n - 30) : n]}[{x[n : n + 20]!r} -> {y[n : n + 20]!r}]"
    token = ""
    if pieces is not None:
        pa = pieces(a.blocks[d].read if d < len(a.blocks) else "")
        pb = pieces(b.blocks[d].read if d < len(b.blocks) else "")
        k = next((i for i, (p, q) in enumerate(zip(pa, pb)) if p != q), min(len(pa), len(pb)))
        token = pb[k] if k < len(pb) else ""
    return excerpt, token


# ---------------------------------------------------------------- the providers' own diagnostics

ANTHROPIC_REASONS = {
    "model_changed": (CloudCause.MODEL_CHANGED, ""),
    "system_changed": (CloudCause.CONTENT, "system"),
    "tools_changed": (CloudCause.CONTENT, "tools"),
    "messages_changed": (CloudCause.CONTENT, "messages"),
}
OPENAI_REASONS = {
    "model_changed": CloudCause.MODEL_CHANGED,
    "prompt_cache_key_changed": CloudCause.KEY_CHANGED,
    "tools_changed": CloudCause.CONTENT,
    "input_changed": CloudCause.CONTENT,
    "text_format_changed": CloudCause.CONTENT,
    "reasoning_effort_changed": CloudCause.CONTENT,
    "verbosity_changed": CloudCause.CONTENT,
    "context_compacted": CloudCause.CONTENT,
}


def _compare_diagnostics(turn: CloudTurn, req: CloudRequest) -> None:
    """The provider's diagnosis, where the session asked for one, and whether it names tokendiff's cause."""
    diag = req.diagnostics
    if not isinstance(diag, Mapping):
        return
    if req.provider == Provider.ANTHROPIC:
        reason = diag.get("cache_miss_reason")
        kind = reason.get("type") if isinstance(reason, Mapping) else None
        if not isinstance(kind, str):
            return
        turn.provider_reason = kind
        cause, section = ANTHROPIC_REASONS.get(kind, (None, ""))
        if cause is not None:
            field = "messages" if turn.field in MESSAGES_SETTINGS else turn.field  # they invalidate the messages
            turn.agrees = cause == turn.cause and (not section or field.startswith(section))
    elif req.provider == Provider.OPENAI:
        kind = diag.get("type")
        if kind == "cache_hit":
            turn.provider_reason, turn.agrees = "cache_hit", turn.waste == 0
        elif kind == "cache_miss" and isinstance(diag.get("reason"), str):
            turn.provider_reason = diag["reason"]
            expected = OPENAI_REASONS.get(diag["reason"])
            turn.agrees = None if expected is None else expected == turn.cause
        elif kind in ("comparison_response_not_found", "unavailable"):
            turn.provider_reason = kind  # shown; no diagnosis to compare


# ---------------------------------------------------------------- requests in the providers' documented shapes


def _canon(v: Any) -> str:
    """A block's content as a stable string (keys sorted; cache_control left out: it marks, it is not content)."""
    import json

    def strip(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: strip(w) for k, w in x.items() if k != "cache_control"}
        if isinstance(x, list):
            return [strip(w) for w in x]
        return x

    return json.dumps(strip(v), sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _ttl(block: Any) -> str | None:
    cc = block.get("cache_control") if isinstance(block, dict) else None
    if not isinstance(cc, dict):
        return None
    ttl = cc.get("ttl")
    return ttl if ttl in TTL else "5m"


# settings whose change keeps the tools and system entries but not the messages' (the prompt-caching page's
# "What invalidates the cache"): they sit between the system prompt and the messages
MESSAGES_SETTINGS = ("tool_choice", "thinking")


def anthropic_blocks(body: Mapping[str, Any]) -> list[Block]:
    """tools -> system -> messages, one block per tool, system block and content block (and the settings
    whose change invalidates the messages' entries, before them)."""
    out: list[Block] = []
    for j, tool in enumerate(body.get("tools") or []):
        out.append(Block(f"tools[{j}]", _canon(tool), _ttl(tool)))
    system = body.get("system")
    if isinstance(system, str):
        out.append(Block("system", system))
    elif isinstance(system, list):
        out += [Block(f"system[{k}]", _canon(b), _ttl(b)) for k, b in enumerate(system)]
    out += [Block(key, _canon(body[key])) for key in MESSAGES_SETTINGS if body.get(key) is not None]
    messages = body.get("messages") or []
    # the thinking of the turns before the current one (which began at the last user message that is not
    # tool results) is stripped, in a tool loop's requests too
    current = _current_turn(messages) if _strips_thinking(str(body.get("model") or "")) else 0
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        role = m.get("role") if isinstance(m, dict) else None
        if isinstance(content, list):
            for k, b in enumerate(content):
                thinking = role == "assistant" and isinstance(b, dict) and b.get("type") in THINKING_BLOCKS
                if not (thinking and i < current):
                    field = f"messages[{i}].content[{k}]"
                    out.append(Block(field, f"{role}:{_canon(b)}", _ttl(b), thinking=thinking, history=True))
        else:
            out.append(Block(f"messages[{i}]", f"{role}:{_canon(content)}", history=True))
    auto = body.get("cache_control")
    if isinstance(auto, dict) and out and not out[-1].breakpoint:
        last = out[-1]
        out[-1] = replace(last, breakpoint=auto.get("ttl") if auto.get("ttl") in TTL else "5m")
    return out


THINKING_BLOCKS = ("thinking", "redacted_thinking")
# models that keep only the current turn's thinking blocks in context (the extended-thinking page: Claude Opus 4.1
# and earlier Opus, Sonnet 4.5 and earlier, Haiku through 4.5; Opus 4.5 and Sonnet 4.6 on keep them all): the
# earlier turns' are stripped, and the cache that held them is lost from the first, at each new user turn
STRIPS_THINKING = frozenset(
    (
        *("claude-3-7-sonnet", "claude-sonnet-4", "claude-sonnet-4-0", "claude-sonnet-4-5"),
        *("claude-opus-4", "claude-opus-4-0", "claude-opus-4-1", "claude-haiku-4-5"),
    )
)
MODEL_SNAPSHOT = re.compile(r"(?:[-@]\d{8}|-latest)$")  # claude-sonnet-4-5-20250929, Vertex's claude-opus-4-1@20250805


def _strips_thinking(model: str) -> bool:
    """Whether the model drops earlier turns' thinking blocks (a model tokendiff does not know about is
    assumed to keep them: no verdict is made of a rule that may not apply)."""
    return MODEL_SNAPSHOT.sub("", model.lower()) in STRIPS_THINKING


def _current_turn(messages: Any) -> int:
    """Where the current turn begins: the last user message that is not only tool results (0: none)."""
    if not isinstance(messages, list):
        return 0
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if isinstance(m, dict) and m.get("role") == "user" and not _tool_results(m.get("content")):
            return i
    return 0


def _tool_results(content: Any) -> bool:
    return (
        isinstance(content, list)
        and bool(content)
        and all(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)
    )


HIDDEN_KEYS = frozenset(("role", "type", "id", "call_id", "tool_call_id", "status", "cache_control"))


def _visible(v: Any) -> str:
    """What a model reads of an item: its strings, in order, without the JSON around them or the ids and
    kinds a template turns into a few fixed tokens (those are counted with the template's markers)."""
    if isinstance(v, str):
        return v
    if isinstance(v, dict):
        return "\n".join(t for k, w in v.items() if k not in HIDDEN_KEYS and (t := _visible(w)))
    if isinstance(v, list):
        return "\n".join(t for w in v if (t := _visible(w)))
    return "" if v is None or isinstance(v, bool) else str(v)


def openai_blocks(body: Mapping[str, Any]) -> list[Block]:
    """Tools first (they sit before the conversation), then instructions and each message or input item."""
    out: list[Block] = []
    if body.get("tools"):
        out.append(Block("tools", _canon(body["tools"])))
    if isinstance(body.get("instructions"), str):
        out.append(Block("instructions", body["instructions"]))
    items = body.get("input", body.get("messages"))
    name = "input" if "input" in body else "messages"
    if isinstance(items, str):
        out.append(Block("input", items, history=True))
    for i, m in enumerate(items if isinstance(items, list) else []):
        turn = _role(m) not in ("system", "developer")  # a system message is the system prompt
        out.append(Block(f"{name}[{i}]", _canon(m), visible=_visible(m), history=turn))
    return out


def gemini_blocks(body: Mapping[str, Any]) -> list[Block]:
    out: list[Block] = []
    for key in ("tools", "systemInstruction", "system_instruction"):
        if body.get(key):
            out.append(Block(key, _canon(body[key])))
    for i, c in enumerate(body.get("contents") or []):
        out.append(Block(f"contents[{i}]", _canon(c), history=True))
    return out


def cloud_request(
    provider: Provider, body: Mapping[str, Any], response: Mapping[str, Any] | None, t: float | None = None
) -> CloudRequest:
    """A recorded request and response in the provider's documented shape, as the model reads them."""
    if provider == Provider.DEEPSEEK:
        body = deepseek_body(body)
    blocks = {
        Provider.ANTHROPIC: anthropic_blocks,
        Provider.OPENAI: openai_blocks,
        # DeepSeek's own API takes chat messages; its Anthropic-compatible one (/anthropic) Messages bodies
        Provider.DEEPSEEK: anthropic_blocks if _messages_api(body) else openai_blocks,
        # Gemini's own generateContent; its OpenAI-compatible endpoint takes chat messages
        Provider.GEMINI: gemini_blocks if "contents" in body or "messages" not in body else openai_blocks,
    }[provider](body)
    resp: Mapping[str, Any] = response if isinstance(response, Mapping) else {}
    model = str(body.get("model") or resp.get("model") or resp.get("modelVersion") or "").removeprefix("models/")
    diag = resp.get("diagnostics") if provider == Provider.ANTHROPIC else resp.get("prompt_cache_diagnostics")
    key = body.get("prompt_cache_key")
    retention = body.get("prompt_cache_retention")
    breakpoints = provider == Provider.OPENAI and openai_breakpoint_regime(model)
    cached = body.get("cachedContent", body.get("cached_content")) if provider == Provider.GEMINI else None
    return CloudRequest(
        provider,
        model,
        tuple(openai_breakpoints(body, blocks) if breakpoints else blocks),
        usage_of(resp),
        t,
        key if isinstance(key, str) else None,
        retention if isinstance(retention, str) else None,
        diag,
        breakpoints=breakpoints,
        cached_content=cached if isinstance(cached, str) and cached else None,
        creates=gemini_cache_made(body, resp, t) if provider == Provider.GEMINI else None,
        failed=failure(resp),
        partial=isinstance(cached, str) or isinstance(body.get("previous_response_id"), str),
    )


def deepseek_body(body: Mapping[str, Any]) -> Mapping[str, Any]:
    """A request to DeepSeek with the model that serves it: its Anthropic-compatible API serves a `claude-opus*`
    name with deepseek-v4-pro and any other `claude*` with deepseek-flash (and ignores `cache_control`: its
    own prefix caching applies), so that model's rules and price are the request's."""
    model = body.get("model")
    if not (isinstance(model, str) and model.lower().startswith("claude")):
        return body
    return {**body, "model": "deepseek-v4-pro" if model.lower().startswith("claude-opus") else "deepseek-flash"}


def _messages_api(body: Mapping[str, Any]) -> bool:
    """A Messages body (a top-level system prompt, or tools with an input_schema), not chat completions."""
    tools = body.get("tools")
    return isinstance(body.get("system"), (str, list)) or (
        isinstance(tools, list) and any(isinstance(t, Mapping) and "input_schema" in t for t in tools)
    )


ERROR_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")


def failure(response: Mapping[str, Any]) -> str | None:
    """What an answer that counted nothing failed with, e.g. `an error (overloaded_error, status 529)`;
    None for an answer that counted its prompt (an error after a stream's first event still did)."""
    u = usage_of(response)
    if u.prompt is not None or u.cached is not None or u.written is not None:
        return None
    status, err = response.get("status"), response.get("error")
    bad = status if isinstance(status, int) and not isinstance(status, bool) and status >= 400 else None
    if bad is None and err is None:
        return None
    names = [err.get(k) for k in ("code", "type", "status")] if isinstance(err, Mapping) else []  # the most precise
    name = next((n for n in names if isinstance(n, str) and ERROR_NAME.fullmatch(n)), None)
    said = ", ".join(x for x in (name, None if bad is None else f"status {bad}") if x)
    return f"an error ({said})" if said else "an error"


def openai_breakpoint_regime(model: str) -> bool:
    """GPT-5.6 and later cache at breakpoints (the guide's newer regime); earlier models by 128-token steps."""
    m = re.match(r"gpt-(\d+)(?:\.(\d+))?", model.lower())
    return m is not None and (int(m[1]), int(m[2] or 0)) >= (5, 6)


def openai_breakpoints(body: Mapping[str, Any], blocks: list[Block]) -> list[Block]:
    """The blocks with GPT-5.6's breakpoints, living `prompt_cache_options.ttl` (30m): each item holding a
    content block marked `prompt_cache_breakpoint`; in implicit mode (the default) also the end of each
    user message, of each run of tool outputs, and of the initial developer block (or the instructions)."""
    opts = body.get("prompt_cache_options")
    opts = opts if isinstance(opts, Mapping) else {}
    ttl = opts["ttl"] if opts.get("ttl") in TTL else "30m"
    items = body.get("input", body.get("messages"))
    items = items if isinstance(items, list) else []
    at = len(blocks) - len(items)  # the first item's block (tools and instructions come before)
    marks = {at + i: True for i, item in enumerate(items) if _marked(item)}
    if opts.get("mode") != "explicit":
        for i in _message_ends(items):
            marks.setdefault(at + i, False)
        if not _initial_developer(items) and body.get("instructions"):
            marks.setdefault(at - 1, False)
    return [replace(b, breakpoint=ttl, explicit=marks[k]) if k in marks else b for k, b in enumerate(blocks)]


def _marked(item: Any) -> bool:
    content = item.get("content") if isinstance(item, Mapping) else None
    return isinstance(content, list) and any(
        isinstance(c, Mapping) and c.get("prompt_cache_breakpoint") for c in content
    )


def _role(item: Any) -> str:
    """A Responses item's or chat message's kind: its role, or `tool` for a function call's output."""
    if not isinstance(item, Mapping):
        return ""
    return "tool" if item.get("type") == "function_call_output" else str(item.get("role") or item.get("type") or "")


def _initial_developer(items: list[Any]) -> int:
    """How many developer (or system) messages open the input."""
    return next((i for i, item in enumerate(items) if _role(item) not in ("developer", "system")), len(items))


def _message_ends(items: list[Any]) -> list[int]:
    """The implicit breakpoints: each user message, the last of each run of tool outputs, the last of the
    initial developer block."""
    roles = [_role(item) for item in items]
    ends = [i for i, r in enumerate(roles) if r == "user"]
    ends += [i for i, r in enumerate(roles) if r == "tool" and (i + 1 == len(roles) or roles[i + 1] != "tool")]
    initial = _initial_developer(items)
    return sorted(ends + ([initial - 1] if initial else []))


def gemini_cache_made(body: Mapping[str, Any], response: Mapping[str, Any], t: float | None) -> ExplicitCache | None:
    """The cached content a `POST cachedContents` exchange made (its name, its tokens, its expiry from the
    response's `expireTime`, else the request's `ttl`); None for any other request."""
    name = response.get("name")
    if not (isinstance(name, str) and name.startswith("cachedContents/")):
        return None
    meta = response.get("usageMetadata")
    tokens = meta.get("totalTokenCount") if isinstance(meta, Mapping) else None
    start = t or 0.0
    expires = _timestamp(response.get("expireTime")) or _timestamp(body.get("expireTime"))
    ttl = _ttl_seconds(body.get("ttl"))
    return ExplicitCache(
        name,
        tokens if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0 else 0,
        expires if expires is not None else start + (ttl if ttl is not None else GEMINI_EXPLICIT_TTL),
    )


def _ttl_seconds(v: Any) -> float | None:
    """A protobuf Duration as JSON gives it (`"300s"`, `"1.5s"`)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)s", v) if isinstance(v, str) else None
    return float(m[1]) if m else None


def _timestamp(v: Any) -> float | None:
    """An RFC 3339 time (`2026-12-06T12:00:00.123456789Z`) in seconds; None if it is not one."""
    from datetime import datetime

    if not isinstance(v, str):
        return None
    v = re.sub(r"(\.\d{6})\d+", r"\1", v.replace("Z", "+00:00"))  # nanoseconds: Python reads six digits
    try:
        return datetime.fromisoformat(v).timestamp()
    except ValueError:
        return None


PROVIDER_HOSTS = (
    ("anthropic.com", Provider.ANTHROPIC),
    ("openai.com", Provider.OPENAI),
    ("googleapis.com", Provider.GEMINI),
    ("deepseek.com", Provider.DEEPSEEK),
)


def provider_of(
    upstream: str | None, body: Mapping[str, Any] | None, response: Mapping[str, Any] | None, path: str | None = None
) -> Provider | None:
    """The provider a record was sent to: the upstream's host, else the usage fields only one provider writes."""
    host = (upstream or "").lower()
    for suffix, p in PROVIDER_HOSTS:
        if suffix in host:
            if p == Provider.GEMINI and _on_vertex_claude(host + (path or ""), body, response):
                return Provider.ANTHROPIC  # Claude on Vertex AI (aiplatform.googleapis.com): Anthropic's cache
            return p
    return _by_usage(response)


def _on_vertex_claude(url: str, body: Mapping[str, Any] | None, response: Mapping[str, Any] | None) -> bool:
    """A request to Claude on Vertex AI, whose host is Google's: its route (`/publishers/anthropic/models/`),
    its body's `anthropic_version`, or its answer's Anthropic usage (an error answer has none: the route
    still tells)."""
    said = isinstance(body, Mapping) and isinstance(body.get("anthropic_version"), str)
    return "/publishers/anthropic/" in url.lower() or said or _by_usage(response) == Provider.ANTHROPIC


def _by_usage(response: Mapping[str, Any] | None) -> Provider | None:
    """The provider whose own usage fields an answer carries."""
    resp: Mapping[str, Any] = response if isinstance(response, Mapping) else {}
    usage = resp.get("usage") if isinstance(resp.get("usage"), Mapping) else {}
    assert isinstance(usage, Mapping)
    if "usageMetadata" in resp or "usage_metadata" in resp:
        return Provider.GEMINI
    if "prompt_cache_hit_tokens" in usage:
        return Provider.DEEPSEEK
    if "cache_creation_input_tokens" in usage:
        return Provider.ANTHROPIC
    return None
