"""Each turn's verdict: what the content allowed, what llama-server's policy allowed, what the server reported,
and a class for every gap between them.

- **content**: the longest prefix the prompt shares with a state the conversation left in the server (the
  previous turn's prompt and reply, or an earlier turn's), at least one token evaluated;
- **engine**: what the policy model (tokendiff.core.cache.llama) says the server reuses, given its flags;
- **reported**: `timings.cache_n` (or `cached_tokens`).

A gap is *content* (the client changed the prompt), *engine* (slot choice, the RAM cache, checkpoints,
context shift, chunk reuse, a restart), *cache key* (adapters, model or template changed), *idle* (evicted
while idle), or *unexplained* (the server differs from the model and nothing says why). Reuse that should
not have happened (KV computed under other adapters) is a false hit, reported apart. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from tokendiff.core.align import common_prefix
from tokendiff.core.cache.advice import Advisor
from tokendiff.core.cache.engine_log import Aligned, LogAligner, LogTask, TurnNumbers, describe
from tokendiff.core.cache.llama import EngineConfig, EngineSim, Fate, Outcome, Request, SelectedBy
from tokendiff.core.kinds import GapClass
from tokendiff.core.plain import replace
from tokendiff.core.rounding import counted


class Gap(StrEnum):
    """The rule behind a gap."""

    CLIENT_EDIT = "client_edit"  # the client changed the prompt before its end
    CACHE_OFF = "cache_prompt_off"  # the request asked for no prefix reuse
    SLOT_SIMILARITY = "slot_similarity"  # similarity sent the request (or the one before) to another slot
    SLOT_LRU = "slot_lru"  # no slot similar enough: the least recently used one
    SLOT_PINNED = "slot_pinned"  # the request's id_slot
    CACHE_RAM_EVICTED = "cache_ram_evicted"  # saved to the host-memory cache, pushed out before it was wanted
    CACHE_RAM_SKIPPED = "cache_ram_skipped"  # in the host-memory cache but not loaded
    CACHE_RAM_OFF = "cache_ram_off"  # displaced from its slot with no host-memory cache to keep it
    CHECKPOINT = "checkpoint"  # SWA/hybrid: only a checkpoint before the divergence
    CONTEXT_SHIFT = "context_shift"  # the context filled while generating: the middle dropped
    CHUNK_REUSE = "chunk_reuse"  # --cache-reuse shifted cached chunks into place (a gain)
    REPLY_IN_SLOT = "reply_in_slot"  # the slot held the previous reply, which the prompt repeats (a gain)
    RESTART = "restart"  # the server restarted: its slots were empty
    LORA = "lora"  # a changed per-request adapter list cleared the slot
    MODEL = "model"  # another model or template served it
    IDLE_CLEARED = "idle_cleared"  # cleared while idle, for another client's task (unified KV cache)
    OTHER_CLIENT = "other_client"  # a request not in the session took the slot (seen in the server's log)
    SERVER_CACHE_OFF = "no_cache_prompt"  # the server runs with --no-cache-prompt: no prefix reuse
    REPLY_RETOKENIZED = "reply_retokenized"  # the reply sent back as text: other IDs than the slot's
    REFUSED = "refused"  # the server answered an error: it ran nothing, so nothing was lost (0 tokens)
    UNKNOWN = "unknown"


GAP_CLASS = {
    Gap.CLIENT_EDIT: GapClass.CONTENT,
    Gap.CACHE_OFF: GapClass.CONTENT,
    Gap.REFUSED: GapClass.CONTENT,
    Gap.REPLY_RETOKENIZED: GapClass.CONTENT,
    Gap.SLOT_SIMILARITY: GapClass.ENGINE,
    Gap.SLOT_LRU: GapClass.ENGINE,
    Gap.SLOT_PINNED: GapClass.ENGINE,
    Gap.CACHE_RAM_EVICTED: GapClass.ENGINE,
    Gap.CACHE_RAM_SKIPPED: GapClass.ENGINE,
    Gap.CACHE_RAM_OFF: GapClass.ENGINE,
    Gap.CHECKPOINT: GapClass.ENGINE,
    Gap.CONTEXT_SHIFT: GapClass.ENGINE,
    Gap.CHUNK_REUSE: GapClass.ENGINE,
    Gap.REPLY_IN_SLOT: GapClass.ENGINE,
    Gap.RESTART: GapClass.ENGINE,
    Gap.OTHER_CLIENT: GapClass.ENGINE,
    Gap.SERVER_CACHE_OFF: GapClass.ENGINE,
    Gap.LORA: GapClass.CACHE_KEY,
    Gap.MODEL: GapClass.CACHE_KEY,
    Gap.IDLE_CLEARED: GapClass.IDLE,
    Gap.UNKNOWN: GapClass.UNEXPLAINED,
}

_BY_SELECTION = {
    SelectedBy.SIMILARITY: Gap.SLOT_SIMILARITY,
    SelectedBy.LRU: Gap.SLOT_LRU,
    SelectedBy.ID: Gap.SLOT_PINNED,
}


@dataclass(frozen=True)
class GapItem:
    """One gap: `tokens` lost (negative) or gained (positive) to `kind`, and the numbers that show it."""

    kind: Gap
    tokens: int
    evidence: str

    @property
    def cls(self) -> GapClass:
        return GAP_CLASS[self.kind]


@dataclass
class EngineTurn:
    """A turn as the engine saw it: the model's outcome, what the content allowed, the verdict."""

    outcome: Outcome
    content: int  # tokens the content allowed reusing
    source: int  # the earlier turn whose state the content is measured against (0: none)
    before: tuple[Fate, int, str]  # where that state was when the request came
    reply_unknown: int = 0  # tokens of the source's reply held in the slot whose IDs are unknown
    source_shifted: bool = False  # the source turn's own generation shifted the context
    source_len: int = 0  # the source turn's prompt length
    reported: int | None = None
    gaps: list[GapItem] = field(default_factory=list)
    verdict: GapClass | None = None  # the class of the largest loss; None: nothing lost
    log: list[str] = field(default_factory=list)  # what the server's log says of this request
    log_task: LogTask | None = None  # its task in the server's log
    others: int = 0  # other clients' requests the log shows since the previous turn
    restarted: bool = False  # the log shows a server start since the previous turn
    recorded_slot: int | None = None  # the slot the server says it used (the answer's id_slot, the proxy's record)
    key_changed: bool = False  # another model or template than the turn before served it
    refused: bool = False  # the server answered an error (context exceeded): it ran nothing
    source_reply_text: bool = False  # the source's reply IDs are its text tokenised, not the generated ones

    @property
    def engine(self) -> int:
        return self.outcome.cache_n

    @property
    def matched(self) -> bool | None:
        """The model's prediction is what the server reported (None: no report)."""
        return None if self.reported is None else self.reported == self.engine

    @property
    def false_hit(self) -> str:
        """Why the server's reuse should not have happened: KV of other adapters, or of another model."""
        if self.outcome.false_hit:
            return self.outcome.false_hit
        if self.key_changed and self.reported:
            return f"the server reused {counted(self.reported, 'token')} across a change of model or template"
        return ""


CHANGED_BEFORE_END = "the prompt changed before its end"  # a turn's waste that no cause names
LAST_TOKEN_AGAIN = "the whole prompt was cached: the server evaluates its last token again"  # core.cost.uncaused_waste


def client_waste(et: EngineTurn, turn: int, n: int, wasted: int, cause: str) -> tuple[int, str]:
    """What the client's changes cost this turn, against the state the content is measured on: the previous
    turn's diff (`wasted` tokens, to `cause`), or, where an earlier turn's state serves better (another
    conversation came between), the part of that turn's prompt this one does not repeat."""
    if et.source in (0, turn - 1):
        return wasted, cause
    lost = max(0, min(et.source_len, n - 1) - et.content)
    return lost, (f"the prompt differs from turn {et.source}'s, its conversation's last" if lost else "")


def classify(et: EngineTurn, cfg: EngineConfig, wasted: int, cause: str, log_gap: GapItem | None = None) -> None:
    """Fill the turn's gaps and verdict: the client's (`wasted` tokens to `cause`, `client_waste`), the engine's
    (the model against the content), and the server's against the model (`log_gap` when its log says why)."""
    if et.refused:
        why = "the server answered an error (as a prompt past the slot's context gets): it ran nothing, lost nothing"
        et.gaps, et.verdict = [GapItem(Gap.REFUSED, 0, why)], None
        return
    gaps = []
    if et.outcome.cache_off_by_server:
        why = "the server runs with --no-cache-prompt and the request did not ask for cache_prompt: nothing reused"
        gaps.append(GapItem(Gap.SERVER_CACHE_OFF, -et.content, why))
    elif et.outcome.cache_off:
        gaps.append(GapItem(Gap.CACHE_OFF, -et.content, "the request set cache_prompt false: nothing reused"))
    elif wasted > 0:
        gaps.append(GapItem(Gap.CLIENT_EDIT, -wasted, cause or CHANGED_BEFORE_END))
    if not et.outcome.cache_off:
        d = et.engine - et.content
        if d > 0:
            gaps.append(_gain(et, d))
        elif d < 0:
            gaps.append(_loss(et, cfg, d))
    if et.reported is not None and et.reported != et.engine:
        gaps.append(log_gap or _retokenized(et) or _from_log(et) or _unexplained(et, cfg))
    et.gaps = gaps
    lost = [g for g in gaps if g.tokens < 0]
    et.verdict = min(lost, key=lambda g: g.tokens).cls if lost else None


def _gain(et: EngineTurn, d: int) -> GapItem:
    o = et.outcome
    if o.chunks:
        moved = ", ".join(f"[{c.c0:,}, {c.c1:,}) -> [{c.p0:,}, {c.p1:,})" for c in o.chunks[:3])
        return GapItem(Gap.CHUNK_REUSE, d, f"--cache-reuse shifted {len(o.chunks)} cached chunk(s) into place: {moved}")
    return GapItem(Gap.UNKNOWN, d, f"the model reuses {counted(d, 'token')} more than the content shares")


def _loss(et: EngineTurn, cfg: EngineConfig, d: int) -> GapItem:
    """Why the policy kept less than the content allowed: where the wanted state was, and what the request did."""
    o = et.outcome
    fate, where, how = et.before
    if o.lora_cleared:
        return GapItem(Gap.LORA, d, "the request's `lora` list differs from the slot's adapters: the slot was cleared")
    if et.source_shifted:
        return GapItem(Gap.CONTEXT_SHIFT, d, "the previous generation filled the slot's context: it was shifted")
    if fate == Fate.HELD and where == o.slot:
        if o.checkpoint is not None and o.checkpoint.reason:
            return GapItem(Gap.CHECKPOINT, d, o.checkpoint.reason)
        return GapItem(Gap.UNKNOWN, d, f"the state was in slot {where} and the model kept {et.engine:,}")
    if fate == Fate.HELD:
        return GapItem(_BY_SELECTION[o.selected_by], d, _moved(o, where))
    if fate == Fate.IN_RAM:
        if o.selected_by == SelectedBy.SIMILARITY and (o.f_keep or 0) >= 0.5:
            why = (
                f"its state was in the host-memory cache, but similarity chose slot {o.slot} (f_keep "
                f"{o.f_keep:.2f} >= 0.5), so the cache was not consulted"
            )
            return GapItem(Gap.SLOT_SIMILARITY, d, why)
        return GapItem(Gap.CACHE_RAM_SKIPPED, d, "its state was in the host-memory cache, but another one was loaded")
    return _gone(fate, how, d, cfg, where)


def _moved(o: Outcome, where: int) -> str:
    if o.selected_by == SelectedBy.ID:
        return f"the request pinned slot {o.slot} (id_slot); its state was in slot {where}"
    if o.selected_by == SelectedBy.SIMILARITY:
        return f"similarity {o.f_sim:.3f} chose slot {o.slot}; its state was in slot {where}"
    return f"no slot was similar enough: the least recently used, slot {o.slot}; its state was in slot {where}"


def _gone(fate: Fate, how: str, d: int, cfg: EngineConfig, by: int) -> GapItem:
    """A state that left the server before the request: the rule that pushed it out."""
    if fate == Fate.RAM_EVICTED:
        limit = "no byte limit" if cfg.cache_ram_mib < 0 else f"{cfg.cache_ram_mib:,} MiB"
        return GapItem(Gap.CACHE_RAM_EVICTED, d, f"pushed out of the host-memory cache ({limit}) by turn {by}")
    if fate == Fate.RAM_REFUSED:
        return GapItem(Gap.CACHE_RAM_EVICTED, d, f"larger than the whole --cache-ram {cfg.cache_ram_mib:,} MiB")
    if fate == Fate.IDLE_CLEARED:
        return GapItem(Gap.IDLE_CLEARED, d, f"its idle slot was cleared when turn {by} started (unified KV cache)")
    if fate == Fate.LORA_CLEARED:
        return GapItem(Gap.LORA, d, f"turn {by} changed the adapters on its slot, which cleared it")
    if fate == Fate.RESTART:
        gap = Gap.MODEL if "model" in how else Gap.RESTART
        return GapItem(gap, d, f"before turn {by}: {how}")
    if how.startswith("other:"):
        return GapItem(Gap.OTHER_CLIENT, d, f"{how[6:]} took its slot before turn {by} and nothing kept it")
    sel = SelectedBy(how) if how in SelectedBy._value2member_map_ else SelectedBy.LRU
    ram = "" if cfg.ram_on else " and no host-memory cache kept it (--cache-ram 0)"
    gap = _BY_SELECTION[sel] if cfg.ram_on else Gap.CACHE_RAM_OFF
    return GapItem(gap, d, f"turn {by} took its slot (by {sel.value}){ram}")


def _retokenized(et: EngineTurn) -> GapItem | None:
    """The server kept the previous prompt but not all of its reply that the model counted: the reply's IDs were
    its text tokenised, and the model spelt it with other tokens (the catalogue's output_retokenized)."""
    rep, src = et.reported or 0, et.source_len
    if not (et.source_reply_text and src <= rep < et.engine <= et.content):
        return None
    why = (
        f"the slot holds turn {et.source}'s reply as the model generated it; sent back as text, it is tokenised "
        f"to other IDs from token {rep:,} (its count agrees, so the model took them as the slot's)"
    )
    return GapItem(Gap.REPLY_RETOKENIZED, rep - et.engine, why)


def _from_log(et: EngineTurn) -> GapItem | None:
    """The server against the model, where its log says why: a restart, a slot cleared for adapters, a
    context shift or checkpoint the model did not play, another slot than the model's; None where it says
    nothing more than `_unexplained` would (the previous reply in the slot)."""
    task, d = et.log_task, (et.reported or 0) - et.engine
    if task is None:
        return None
    where = f" (log line {task.line:,})"
    if et.restarted:
        return GapItem(Gap.RESTART, d, f"the server restarted since the previous turn{where}")
    if task.lora_cleared:
        return GapItem(Gap.LORA, d, f"the server cleared the slot for a LoRA change{where}")
    if task.checkpoint_none or task.checkpoint_restored is not None:
        what = "restored a checkpoint" if task.checkpoint_restored is not None else "had no checkpoint to restore"
        return GapItem(Gap.CHECKPOINT, d, f"the server {what}{where}")
    if task.slot != et.outcome.slot:
        how = task.selected_by or "an unlogged rule"
        why = f"the server chose slot {task.slot} ({how}), the model slot {et.outcome.slot}{where}"
        return GapItem(Gap.UNKNOWN, d, why + ": the flags differ from the ones given or assumed")
    if 0 < d <= et.reply_unknown:  # the log's account agrees; the previous reply (IDs unknown) is the gain
        return None
    return GapItem(Gap.UNKNOWN, d, "the server's log: " + "; ".join(describe(task)) + where)


def _unexplained(et: EngineTurn, cfg: EngineConfig) -> GapItem:
    """The server against the model, with no log to say why: the previous reply (its IDs unknown), or
    flags that differ from the ones assumed."""
    d = (et.reported or 0) - et.engine
    if 0 < d <= et.reply_unknown:
        return GapItem(
            Gap.REPLY_IN_SLOT, d, f"the slot held the previous reply; the prompt repeats {d:,} of its tokens"
        )
    if et.recorded_slot is not None and et.recorded_slot != et.outcome.slot:
        why = f"the server used slot {et.recorded_slot}, the model slot {et.outcome.slot}"
        return GapItem(Gap.UNKNOWN, d, why + ": the flags differ from the ones given or assumed")
    assumed = cfg.assumed()
    hint = f"; the model assumed llama-server's defaults for {', '.join(assumed)}" if assumed else ""
    more = "more" if d > 0 else "fewer"
    return GapItem(Gap.UNKNOWN, d, f"the server reused {counted(abs(d), 'token')} {more} than the model predicts{hint}")


def verdict_text(et: EngineTurn) -> str:
    """One line for a table or a header: the three numbers and the verdict."""
    rep = "?" if et.reported is None else f"{et.reported:,}"
    head = f"content {et.content:,} · engine {et.engine:,} · server {rep}"
    lost = [g for g in et.gaps if g.tokens < 0]
    if not lost:
        return head + " · nothing lost"
    worst = min(lost, key=lambda g: g.tokens)
    return f"{head} · {worst.cls.value}: {worst.kind.value.replace('_', ' ')}"


# ---------------------------------------------------------------- a session, turn by turn


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _lora(v: object) -> tuple[tuple[int, float], ...] | None:
    """A request's `lora` list as (id, scale) pairs; None when absent, empty or not a list of them."""
    if not isinstance(v, list) or not v:
        return None
    out = []
    for x in v:
        if not isinstance(x, dict) or _int(x.get("id")) is None or not isinstance(x.get("scale"), (int, float)):
            return None
        out.append((int(x["id"]), float(x["scale"])))
    return tuple(out)


def reply_ids(response: Mapping[str, Any] | None) -> np.ndarray | None:
    """What the slot holds after the prompt, when the answer says which tokens were generated (/completion's
    `tokens` with return_tokens, or `__verbose.tokens`): all but the last sampled one."""
    if not isinstance(response, Mapping) or response.get("streamed"):  # a stream's `tokens` are its last chunk's
        return None
    for box in (response, response.get("__verbose")):
        toks = box.get("tokens") if isinstance(box, Mapping) else None
        if isinstance(toks, list) and toks and all(_int(x) is not None for x in toks):
            return np.asarray(toks[:-1], dtype=np.int32)
    return None


def _text_of(content: object, kind: str) -> str | None:
    """A message's content as text: a string, or blocks that are all text (`kind`); None for anything else."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    texts = []
    for b in content:
        if not (isinstance(b, Mapping) and b.get("type") == kind and isinstance(b.get("text"), str)):
            return None
        texts.append(b["text"])
    return "".join(texts)


def reply_text(response: Mapping[str, Any] | None) -> str | None:
    """The reply's text where it is all the reply said (a chat message, a Responses answer's output_text parts,
    a Messages answer's text blocks, a stream's text); None where it also called a tool or reasoned, or was cut
    in the record: then its text does not spell what was generated."""
    if not isinstance(response, Mapping) or response.get("content_truncated"):
        return None
    msg = response.get("message")
    if isinstance(msg, Mapping):  # chat, or a Messages answer's blocks
        if msg.get("tool_calls") or msg.get("reasoning_content"):
            return None
        return _text_of(msg.get("content"), "text")
    out = response.get("output")
    if isinstance(out, list):  # a Responses answer, streamed or not
        texts = [_text_of(o.get("content"), "output_text") if isinstance(o, Mapping) else None for o in out]
        if not all(isinstance(o, Mapping) and o.get("type") == "message" for o in out) or None in texts:
            return None
        return "".join(t for t in texts if t is not None)
    content = response.get("content")
    return content if isinstance(content, str) else None


_LIMITS = ("max_output_tokens", "max_tokens", "max_completion_tokens", "n_predict")  # Responses, Messages/chat


def text_reply(
    tokenize: Callable[[str], Sequence[int]],
    request: Mapping[str, Any],
    response: Mapping[str, Any],
    n_generated: int | None,
) -> np.ndarray | None:
    """What the slot holds after the prompt, from the reply's text tokenised (the answers of chat, Responses
    and Messages carry no IDs). Trusted only where the count is the server's: a reply cut at the request's
    limit is its text's tokens (the slot holds all but the last), one that ended below it is its text's tokens
    and the end-of-generation token (the slot holds the text). Else None: text that re-tokenises otherwise
    than it was generated, a tool call, a stop string."""
    text = reply_text(response)
    if not text or not n_generated:
        return None
    limit = next((v for v in map(_int, (request.get(k) for k in _LIMITS)) if v is not None and v > 0), None)
    ids = np.asarray(tokenize(text), dtype=np.int32)
    if len(ids) == n_generated and n_generated == limit:
        return ids[:-1]
    if len(ids) == n_generated - 1 and (limit is None or n_generated < limit):
        return ids
    return None


def engine_request(
    ids: np.ndarray,
    turn: int,
    request: Mapping[str, Any] | None,
    response: Mapping[str, Any] | None,
    n_generated: int | None,
    reply: np.ndarray | None = None,
    key: str = "",
    user_starts: Sequence[int] = (),
    tokenize: Callable[[str], Sequence[int]] | None = None,
    client_left: bool = False,
) -> Request:
    """A recorded request as the policy model reads it (the user's JSON: anything may be missing). The reply
    the slot holds: `reply`, else the IDs the answer gave, else its text tokenised with `tokenize` (the
    session's tokenizer) where the counts agree. `client_left`: the record's error is the client's leaving
    (core.unanswered), not the server's refusal: the server ran it, or may have, and its slot holds it."""
    req: Mapping[str, Any] = request if isinstance(request, Mapping) else {}
    resp: Mapping[str, Any] = response if isinstance(response, Mapping) else {}
    status = _int(resp.get("status"))
    failed = (status is not None and status != 200) or (bool(resp.get("error")) and "timings" not in resp)
    failed = failed and not (client_left and status in (None, 200))
    slot = _int(req.get("id_slot"))
    if reply is None:
        reply = reply_ids(resp)
    from_text = reply is None and tokenize is not None and not failed
    if from_text and tokenize is not None:
        reply = text_reply(tokenize, req, resp, n_generated)
    return Request(
        ids=np.asarray(ids, dtype=np.int32),
        turn=turn,
        reply=reply,
        n_generated=n_generated or 0,
        reply_from_text=from_text and reply is not None,
        id_slot=slot if slot is not None else -1,
        lora=_lora(req.get("lora")),
        n_keep=_int(req.get("n_keep")),
        n_discard=_int(req.get("n_discard")) or 0,
        n_cache_reuse=_int(req.get("n_cache_reuse")),
        cache_prompt=req.get("cache_prompt") if isinstance(req.get("cache_prompt"), bool) else None,
        user_starts=user_starts,
        key=key,
        failed=failed,
    )


CONTINUES = 0.5  # a turn keeping this much of an earlier prompt continues its conversation (pinning's unit)


class EngineTrack:
    """The policy model run alongside the session analysis: each turn's outcome and what its content allowed.
    Keeps the server's state (a few slots, the RAM cache) and each turn's prompt length and reply, not the
    prompts."""

    def __init__(self, config: EngineConfig, log: LogAligner | None = None, what_if: bool = True):
        self.config = config
        self.sim = EngineSim(config)
        self.log = log  # the server's log, lined up with the turns as they come
        # the same requests under other flags; `sim` plays nothing but them unless a log adds other clients'
        self.advisor = Advisor(config, mirrored=log is None) if what_if else None
        self._conv: dict[int, int] = {}  # turn -> its conversation (the chain of states it continues)
        self._held: dict[int, tuple[int, np.ndarray | None, int]] = {}  # turn -> (prompt length, reply, generated)
        self._text_replies: set[int] = set()  # turns whose reply IDs are their text tokenised
        self._learned: set[str] = set()  # settings the log's tasks showed (`_learn`)
        self._shifted: set[int] = set()
        self._last = 0  # the turn the server last ran (`prev_ids` is its prompt unless it refused one since)
        self._last_ids: np.ndarray | None = None  # that turn's prompt, while a refused request is `prev_ids`

    def add(
        self,
        req: Request,
        prev_ids: np.ndarray | None,
        best: tuple[int | None, int],
        reported: int | None,
        numbers: TurnNumbers | None = None,
    ) -> EngineTurn:
        """The next request: `prev_ids` the prompt of the turn played before it (a request the server never had
        is not played: core.unanswered), `best` (turn, LCP) the earlier prompt sharing the longest prefix with
        this one; `numbers` what the turn says, to find it in the log. A request the server refused leaves its
        state as it was: no later turn is measured against it."""
        if self._last_ids is not None:
            prev_ids = self._last_ids  # a refused request came between: the state is the last one run's
        content, source, unknown = self._content(req, prev_ids, best)
        al = self._logged(req, numbers)
        changed = bool(req.key and self.sim.key and req.key != self.sim.key)
        self.sim.switch(req)
        before = self.sim.where(source) if source else (Fate.OVERWRITTEN, 0, "")
        out = self.sim.request(req)
        if out.shifts:
            self._shifted.add(req.turn)
        length = self._held[source][0] if source in self._held else 0
        et = EngineTurn(out, content, source, before, unknown, source in self._shifted, length, reported)
        et.key_changed, et.refused = changed, req.failed
        et.source_reply_text = source in self._text_replies
        same = source in self._conv and content >= CONTINUES * length  # it keeps most of that state: its sequel
        conv = self._conv[source] if same else len(set(self._conv.values()))
        self._conv[req.turn] = conv
        if self.advisor is not None:
            self.advisor.add(req, conv, out.cache_n)
        if al is not None and al.task is not None:
            et.log_task, et.log, et.others, et.restarted = al.task, describe(al.task), len(al.others), al.restarted
            if et.reported is None:
                et.reported = al.task.reused
        if req.failed:
            if self._last_ids is None and prev_ids is not None and self._last in self._held:
                self._last_ids = prev_ids
            return et
        g = req.n_generated if req.reply is None else len(req.reply) + 1
        self._held[req.turn] = (len(req.ids), req.reply, g)
        if req.reply_from_text:
            self._text_replies.add(req.turn)
        self._last, self._last_ids = req.turn, None
        return et

    def _logged(self, req: Request, numbers: TurnNumbers | None) -> Aligned | None:
        """The turn's task in the log; what came between (a restart, other clients' requests) played first."""
        if self.log is None:
            return None
        al = self.log.next_for(numbers or TurnNumbers(len(req.ids)))
        if al.restarted:
            self.sim.restart(req.turn, "the server restarted")
            if self.advisor is not None:
                self.advisor.restart(req.turn)
        for seen in (*al.others, al.task):  # the flags are the server's: any request's lines show them
            if seen is not None:
                self._learn(seen)
        for o in al.others:
            how = SelectedBy(o.selected_by) if o.selected_by in ("id", "similarity", "lru") else SelectedBy.LRU
            size = o.release_tokens if o.release_tokens is not None else (o.n_prompt or 0)
            label = f"another client's request (task {o.task}, log line {o.line:,})"
            self.sim.foreign(o.slot, how, o.f_keep, size, req.turn, label)
        return al

    def _learn(self, task: LogTask) -> None:
        """Settings only the log's tasks show, unless the flags said: a context shift turns --context-shift on,
        a chunk shifted into place --cache-reuse (its N at most the smallest chunk seen, lowered as smaller ones
        come: each turn's own chunks are read before it is played); and a saved state's size, which a log
        `watch` follows shows only at the first save, after the launch lines it read."""
        cfg, facts = self.config, dict[str, Any]()
        if task.shifts and not cfg.context_shift and "context_shift" not in cfg.known:
            facts["context_shift"] = True
        if task.chunks and ("cache_reuse" not in cfg.known or "cache_reuse" in self._learned):
            n = min(c1 - c0 for c0, c1, _, _ in task.chunks)
            if n > 0 and (cfg.cache_reuse == 0 or n < cfg.cache_reuse):
                facts["cache_reuse"] = n
        if task.bytes_per_token and cfg.bytes_per_token is None and "bytes_per_token" not in cfg.known:
            facts["bytes_per_token"] = task.bytes_per_token  # a live log's first save, after its launch lines
        if not facts:
            return
        self._learned.update(facts)
        sources = cfg.sources if "the server's log" in cfg.sources else (*cfg.sources, "the server's log")
        self.config = replace(cfg, **facts, known=cfg.known | frozenset(facts), sources=sources)
        self.sim.learned(facts)
        if self.advisor is not None:
            self.advisor.learned(facts)

    def _content(self, req: Request, prev_ids: np.ndarray | None, best: tuple[int | None, int]) -> tuple[int, int, int]:
        """(tokens the content allows, the turn whose state gives them, reply tokens of unknown IDs after them)."""
        n, last = len(req.ids), self._last
        cands = []
        if prev_ids is not None and last in self._held:
            cands.append((last, common_prefix(prev_ids, req.ids)))
        if best[0] is not None and best[0] in self._held and best[0] != last:
            cands.append((best[0], best[1]))
        top, source, unknown = 0, 0, 0
        for j, base in cands:
            length, reply, g = self._held[j]
            ext, unk = 0, 0
            if base >= length and n > length:
                if reply is not None:
                    ext = common_prefix(reply, req.ids[length:])
                else:
                    unk = max(0, min(g - 1, n - length))
            if base + ext > top or (base + ext == top and j > source):
                top, source, unknown = base + ext, j, unk
        return min(top, max(0, n - 1)), source, unknown


__all__ = [
    "GapClass",
    "Gap",
    "GAP_CLASS",
    "GapItem",
    "EngineTurn",
    "EngineTrack",
    "classify",
    "client_waste",
    "engine_request",
    "reply_ids",
    "reply_text",
    "text_reply",
    "verdict_text",
]
