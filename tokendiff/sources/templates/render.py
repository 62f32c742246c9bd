"""Render a chat request through its real chat template, attributing every
character to the request field that produced it.

Rendering is jinja2 in transformers' exact chat-template environment
(tokendiff.sources.templates.env), so the text is what `apply_chat_template` gives. Attribution needs no knowledge
of any particular template:

* string fields (message content, reasoning, tool-call names, arguments,
  ids, tool names and descriptions) are wrapped in private-use sentinel
  characters, rendered once more, and located where the sentinels land. The
  render without sentinels must be identical; a field whose wrapping changes
  the output (a template that inspects or strips it) is located by
  substitution instead: render it with its letters rotated and take the
  characters that change.
* each tool's span is what disappears when the tool is left out (snapped to
  the start of a line or of its JSON object, since a deletion can slide over
  text the neighbours share); the tools block is what disappears with all of
  them.
* the generation prompt is what `add_generation_prompt` appends.
* turns (and the template's own boilerplate) come from the family grammar on
  the tokenised text; a turn holding one message's fields is that message.
"""

from __future__ import annotations

import codecs
import hashlib
import re
from collections.abc import Callable
from functools import lru_cache
from itertools import repeat
from typing import Any

import numpy as np

from tokendiff.core.align import shared_prefix, shared_suffix
from tokendiff.core.jsontext import LONE_SURROGATE
from tokendiff.core.kinds import SectionKind as K
from tokendiff.core.model import FieldSpan, Part, Rendered, SectionPath
from tokendiff.errors import InputError
from tokendiff.sources.templates.env import GEN_MARK


class _Sentinels:
    """Private Use characters that wrap fields for one render, half opening and half closing: sentinel k
    opens with chr(start + k) and closes with chr(start + per_render + k). A prompt that holds a
    character of the range (Nerd Font glyphs in a tool's output, Apple's logo) gets the other range:
    with sentinels it cannot tell apart, every field would be located by a render of its own.

    Past `per_render` fields, two characters each side (`paired`): the range in quarters of `base`,
    field k opening with its quotient and remainder by `base` in the first two quarters and closing
    with them in the last two, so one render wraps up to base² fields (2.5 million), not 3,199."""

    __slots__ = ("start", "last", "per_render", "base", "marked")

    def __init__(self, first: str, last: str, marked: bool):
        self.start, self.last = ord(first), ord(last)
        self.per_render = (ord(last) - ord(first) - int(marked)) // 2  # fields wrapped in one render
        self.base = (ord(last) - ord(first) + 1 - int(marked)) // 4  # a quarter of the range, for pairs
        self.marked = marked  # its last character, template_env.GEN_MARK, is where the generation prompt begins

    def field(self, code: int) -> tuple[int, bool]:
        """(the field a sentinel belongs to, whether it closes it)."""
        k = code - self.start
        return (k - self.per_render, True) if k >= self.per_render else (k, False)

    def wraps(self, k: int, paired: bool) -> tuple[str, str]:
        """The opening and closing sentinels of field k."""
        if not paired:
            return chr(self.start + k), chr(self.start + self.per_render + k)
        hi, lo = divmod(k, self.base)
        b, s = self.base, self.start
        return chr(s + hi) + chr(s + b + lo), chr(s + 2 * b + hi) + chr(s + 3 * b + lo)

    def paired_field(self, first: int, second: int) -> tuple[int, bool] | None:
        """(field, whether it closes) of two sentinels written side by side; None unless they are
        one paired sentinel (a template that cut or reordered a field's text)."""
        hi, lo, b = first - self.start, second - self.start, self.base
        if hi < b and b <= lo < 2 * b:
            return hi * b + lo - b, False
        if 2 * b <= hi < 3 * b and 3 * b <= lo < 4 * b:
            return (hi - 2 * b) * b + lo - 3 * b, True
        return None


# the Basic Multilingual Plane's Private Use Area, 6,400 characters (U+F8FF marks the generation prompt): chunks
# of 3,199 fields, every sentinel inside the range they are found by (closing at U+F000 + k once left every
# field past the 2,304th of a chunk unfound, and the chunk's fields then located one by one: 2,400 messages
# took 14 s instead of 0.1 s); then Supplementary Private Use Area-A, for a prompt that holds the first
BMP_SENTINELS = _Sentinels("\ue000", GEN_MARK, marked=True)
PLANE_15_SENTINELS = _Sentinels("\U000f0000", "\U000ffffd", marked=False)
MAX_SENTINELS = BMP_SENTINELS.per_render
GEN_AT = ord(GEN_MARK)


def _sentinels_for(text: str) -> _Sentinels | None:
    """Sentinels that `text` does not hold (None: it holds characters of both ranges). Looked for in
    numpy: a regex search of a 160,000-character prompt cost more than half a render."""
    if text.isascii():  # known without a scan
        return BMP_SENTINELS
    codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")
    return next((s for s in (BMP_SENTINELS, PLANE_15_SENTINELS) if not _holds(codes, s)), None)


def _holds(codes: np.ndarray, sent: _Sentinels) -> bool:
    return bool(((codes >= sent.start) & (codes <= sent.last)).any())


class _Leaf:
    """A string field of a request: where it sits (keys from the body down) and its section path. Shared:
    the same fields recur in every request of a session, so the common ones are made once."""

    __slots__ = ("path", "keys")

    def __init__(self, path: SectionPath, keys: tuple[Any, ...]):
        self.path, self.keys = path, keys

    def get(self, b: dict[str, Any]) -> Any:
        cur: Any = b
        for k in self.keys:
            try:
                cur = cur[k]
            except (KeyError, IndexError, TypeError):
                return None
        return cur

    def set(self, b: dict[str, Any], v: Any) -> None:
        cur: Any = b
        for k in self.keys[:-1]:
            cur = cur[k]
        cur[self.keys[-1]] = v


def template_sha256(template: str) -> str:
    return hashlib.sha256(template.encode()).hexdigest()


def _copy(body: dict[str, Any]) -> dict[str, Any]:
    """A copy of a request to edit: its dicts and lists fresh, its scalars shared (immutable). A request
    is parsed JSON; anything else in it renders as its type's name either way (template_env.plain_data)."""
    from tokendiff.sources.templates.env import plain_data

    copied: dict[str, Any] = plain_data(body)
    return copied


class Renderer:
    """Renders requests with one chat template (compiled once)."""

    def __init__(self, template: str, bos_token: str = "", eos_token: str = "", *, name: str = "", **kwargs: Any):
        if not isinstance(template, str) or not template.strip():
            raise InputError("empty chat template")
        self.template = template
        self.name = name  # where the template came from, for errors (a file, a server, a capture)
        self.defaults = {"bos_token": bos_token, "eos_token": eos_token, **kwargs}
        self._typed: bool | None = None
        self.template_sha256 = template_sha256(template)

    def render(
        self, body: dict[str, Any], add_generation_prompt: bool | None = None, mark_generation: bool = False
    ) -> str:
        """The request's prompt; `mark_generation`: with template_env.GEN_MARK where the generation
        prompt begins, if the template tells (see compile_marked)."""
        body = normalize_tools(body)
        messages = checked_messages(body)
        if _may_hold_parts(messages):
            messages = [self._for_template(i, m) for i, m in enumerate(messages)]
        kwargs = {**_server_context(), **self.defaults}
        effort = body.get("reasoning_effort")  # OpenAI's own field: the servers hand it to the template (gpt-oss)
        if isinstance(effort, str):
            kwargs["reasoning_effort"] = effort
        ctk = body.get("chat_template_kwargs")
        if isinstance(ctk, dict):
            kwargs.update(ctk)
        agp = body.get("add_generation_prompt", True) if add_generation_prompt is None else add_generation_prompt
        out = self._render(messages, body.get("tools") or None, agp, kwargs, mark_generation)
        lone = None if out.isascii() else LONE_SURROGATE.search(out)
        if lone is not None:  # a JSON `\ud83d` without its pair (a string cut mid-emoji): nothing tokenizes it
            raise InputError(
                f"the request holds a lone UTF-16 surrogate (U+{ord(lone[0]):04X}) in a string: no tokenizer "
                "takes it (llama-server refuses such a request)"
            )
        return out

    def _render(self, messages: list[Any], tools: Any, agp: Any, kwargs: dict[str, Any], mark: bool = False) -> str:
        from jinja2 import TemplateError

        from tokendiff.sources.templates.env import TemplateLimit, render_request

        try:
            return render_request(self.template, messages, tools, agp, kwargs, marked=mark)
        except TemplateLimit as e:  # a template that loops or builds gigabytes: stopped at its bound
            raise InputError(str(e), source=self._shown_name()) from None
        except (
            TemplateError,
            TypeError,
            ValueError,
            LookupError,
            AttributeError,
            ArithmeticError,
            RecursionError,
        ) as e:
            raise InputError(f"the chat template failed on this request: {type(e).__name__}: {e}") from None
        except SyntaxError as e:  # nested past what Python compiles: the template, never the request
            raise InputError(f"the chat template cannot be compiled: {e.msg}", source=self._shown_name()) from None

    def _shown_name(self) -> str:
        return (
            f"{self.name} (chat template {self.template_sha256[:12]})"
            if self.name
            else (f"chat template {self.template_sha256[:12]}")
        )

    def _for_template(self, i: int, m: dict[str, Any]) -> dict[str, Any]:
        """The message with list content as llama-server hands it to the template: the parts joined
        with newlines, or kept as text parts for a template that iterates them. Null or missing content
        (what the OpenAI SDK sends beside tool calls) is an empty string, as llama-server makes it:
        Qwen3's and DeepSeek's templates fail on None."""
        if isinstance(m, dict) and m.get("role") == "developer":
            m = dict(m, role=_rendered_role(m["role"]))  # a system message, as llama-server hands it
        content = m.get("content")
        if content is None and isinstance(m, dict):
            return dict(m, content="")
        if not isinstance(content, list):
            return m
        texts = part_texts(content, f"messages[{i}].content")
        if self.typed_content:
            return dict(m, content=[{"type": "text", "text": t} for t in texts])
        return dict(m, content="\n".join(texts))

    @property
    def typed_content(self) -> bool:
        """Whether the template shows content only when given as a list of parts (minja's
        requires_typed_content, which llama-server uses to decide): probed once."""
        if self._typed is None:
            needle = "\ue000tokendiff-probe\ue001"

            def shows(content: Any) -> bool:
                try:
                    return needle in self._render([{"role": "user", "content": content}], None, False, self.defaults)
                except InputError:
                    return False

            self._typed = not shows(needle) and shows([{"type": "text", "text": needle}])
        return self._typed

    # ------------------------------------------------------------ attribution

    def attribute(self, body: dict[str, Any], text: str | None = None) -> Rendered:
        """The render with every field's span. `text`: the render as the caller has it already (its
        tokens decoded): taken only if the sentinel render confirms it, else rendered here."""
        body = normalize_tools(body)
        leaves = _leaves(body)
        spans, gen_at = self._confirmed_spans(body, leaves, text) if text is not None else (None, None)
        unlocated: list[str] = []
        if text is None or spans is None:
            text = self.render(body)
            spans, gen_at = self._leaf_spans(body, leaves, text, unlocated)
        r = Rendered(text, template_sha256=self.template_sha256, unlocated=unlocated)
        r.spans += [_with_think_tags(text, sp) for sp in spans]
        r.spans += self._tool_spans(body, text)
        r.spans += self._message_spans(r.spans)
        if gen_at is None:  # where the render without the generation prompt ends
            no_gen = self.render(body, add_generation_prompt=False)
            gen_at = len(no_gen) if text.startswith(no_gen) else len(text)
        if gen_at < len(text):
            r.spans.append(FieldSpan(SectionPath.of(Part(K.GENERATION_PROMPT)), gen_at, len(text)))
        r.spans.sort(key=lambda s: (s.start, -s.end, len(s.path)))
        return r

    def confirms(self, body: dict[str, Any], text: str) -> bool:
        """Whether `attribute(body, text)` takes `text` as the render: its sentinel render, sentinels
        removed, is `text` (a template that reads its fields' text may render them wrapped the way the
        server rendered them bare)."""
        body = normalize_tools(body)
        return self._confirmed_spans(body, _leaves(body), text)[0] is not None

    def _confirmed_spans(
        self, body: dict[str, Any], leaves: list[_Leaf], text: str
    ) -> tuple[list[FieldSpan] | None, int | None]:
        """The fields' spans if every chunk's sentinel render is `text` without the sentinels: then
        `text` is the render, with no render of its own. None when some render is not, or none ran.
        Second, where the generation prompt begins, when the template marks it (else None)."""
        spans: list[FieldSpan] = []
        rendered = False
        gen_at: int | None = None
        sent = _sentinels_for(text)
        if sent is None:
            return None, None
        if len(leaves) > sent.per_render:
            whole = self._at_once(body, leaves, text, sent)
            if whole is not None:
                return whole
        for chunk in _chunks(leaves, sent.per_render):
            got = self._sentinel_render(body, chunk, sent)
            if got is None:
                if any(isinstance(v := leaf.get(body), str) and v for leaf in chunk):
                    return None, None  # the template failed on the wrapped fields
                continue
            if got[1] != text:
                return None, None
            rendered = True
            found, gen_at = _sentinel_spans(got[0], chunk, sent)
            spans += found
        return (spans, gen_at) if rendered else (None, None)

    def _at_once(
        self, body: dict[str, Any], leaves: list[_Leaf], text: str, sent: _Sentinels
    ) -> tuple[list[FieldSpan], int | None] | None:
        """The spans of more fields than one render wraps a character each side, from one render with
        two characters each side (`_Sentinels.paired_field`): a conversation of 100,000 parts in one
        render, not 32 (each of a copy of the whole request). Second, where the generation prompt
        begins, if marked. None when the render is not `text` without its sentinels, when some
        sentinel came out cut or reordered, or when no field has text: the callers then wrap a chunk
        of fields at a time, as they would have (a template that reads its fields' text may take
        two characters where it takes one)."""
        spans: list[FieldSpan] = []
        gen_at: int | None = None
        for chunk in _chunks(leaves, sent.base * sent.base):
            got = self._sentinel_render(body, chunk, sent, paired=True)
            found = _paired_spans(got[0], chunk, sent) if got is not None and got[1] == text else None
            if found is None:
                return None
            spans += found[0]
            gen_at = found[1]
        return spans, gen_at

    def _sentinel_render(
        self, body: dict[str, Any], leaves: list[_Leaf], sent: _Sentinels, paired: bool = False
    ) -> tuple[_Marks, str] | None:
        """The render with `leaves` wrapped in sentinels (and the generation prompt marked where the
        template allows), as (each sentinel's code and position in the text without them, that text);
        None when no leaf has text to wrap or the template fails on the wrapped request."""
        wrapped = _copy(body)
        used = 0
        for k, leaf in enumerate(leaves):
            v = leaf.get(wrapped)
            if isinstance(v, str) and v:
                opening, closing = sent.wraps(k, paired)
                leaf.set(wrapped, opening + v + closing)
                used += 1
        if not used:
            return None
        try:
            out = self.render(wrapped, mark_generation=sent.marked)
        except InputError:
            return None
        return _marks(out, sent)

    def _leaf_spans(
        self, body: dict[str, Any], leaves: list[_Leaf], text: str, unlocated: list[str]
    ) -> tuple[list[FieldSpan], int | None]:
        """Every field's span in `text`, and where the generation prompt begins when one render wrapped
        every field and marked it (else None)."""
        sent = _sentinels_for(text)
        if sent is not None and len(leaves) > sent.per_render:
            whole = self._at_once(body, leaves, text, sent)
            if whole is not None:
                return whole
        spans: list[FieldSpan] = []
        chunks = _chunks(leaves, sent.per_render if sent else 1)
        gen_at: int | None = None
        for chunk in chunks:
            found = self._wrapped(body, chunk, text, sent) if sent else None
            if found is not None:
                spans += found[0]
                gen_at = found[1] if len(chunks) == 1 else None
            else:
                spans += self._halved(body, chunk, text, sent, unlocated)
        return spans, gen_at

    def _halved(
        self, body: dict[str, Any], leaves: list[_Leaf], text: str, sent: _Sentinels | None, unlocated: list[str]
    ) -> list[FieldSpan]:
        """The spans of `leaves`, whose wrapping together changed the output: each half wrapped on its own,
        down to the fields whose wrapping alone changes it, which are located by substitution (or listed
        in `unlocated`). A template that reads one field's text (Qwen3 tests whether a user's message
        starts with `<tool_response>`) costs a few renders a field so read, not one render a field."""
        if len(leaves) == 1:
            s = self._substituted(body, leaves[0], text)
            if s is None and _nonempty(leaves[0].get(body)):
                unlocated.append(leaves[0].path[-1].field or "")
            return [s] if s is not None else []
        spans: list[FieldSpan] = []
        for half in (leaves[: len(leaves) // 2], leaves[len(leaves) // 2 :]):
            found = self._wrapped(body, half, text, sent) if sent else None
            spans += found[0] if found is not None else self._halved(body, half, text, sent, unlocated)
        return spans

    def _wrapped(
        self, body: dict[str, Any], leaves: list[_Leaf], text: str, sent: _Sentinels
    ) -> tuple[list[FieldSpan], int | None] | None:
        """The spans of `leaves` from one sentinel render, if it is `text` once the sentinels are
        removed ([] when no leaf has text), and where it marked the generation prompt; None when the
        wrapping changes the output."""
        if not any(isinstance(v := leaf.get(body), str) and v for leaf in leaves):
            return [], None
        got = self._sentinel_render(body, leaves, sent)
        if got is None or got[1] != text:
            return None
        return _sentinel_spans(got[0], leaves, sent)

    def _substituted(self, body: dict[str, Any], leaf: _Leaf, text: str) -> FieldSpan | None:
        v = leaf.get(body)
        if not isinstance(v, str) or not v:
            return None
        changed = _copy(body)
        leaf.set(changed, _rotate(v))
        try:
            out = self.render(changed)
        except InputError:
            return None
        if len(out) != len(text) or out == text:
            return None
        diff = [i for i, (x, y) in enumerate(zip(text, out)) if x != y]
        a, b = diff[0], diff[-1] + 1
        # snap to the value itself when the template shows it verbatim or stripped
        for form in (v, v.strip(), v.strip("\n")):
            if form:
                i = text.rfind(form, 0, b)
                if i >= 0 and i <= a and i + len(form) >= b:
                    return FieldSpan(leaf.path, i, i + len(form))
        return FieldSpan(leaf.path, a, b)

    def _tool_spans(self, body: dict[str, Any], text: str) -> list[FieldSpan]:
        tools = body.get("tools")
        if not isinstance(tools, list) or not tools:
            return []
        spans = []
        without_all = dict(body, tools=None)
        block = _removed_span(text, self._render_quiet(without_all), snap=True)
        short, short_text, agree = self._tools_context(body, text, block)
        for j, tool in enumerate(tools):
            rest = tools[:j] + tools[j + 1 :]
            s, reach = _removed_run(short_text, self._render_quiet(dict(short, tools=rest)), snap=True)
            if short is not body and reach > agree:  # decided past what the cut renders as the whole does
                s = _removed_span(text, self._render_quiet(dict(body, tools=rest)), snap=True)
            if s:
                spans.append(FieldSpan(SectionPath.of(TOOLS, _tool_part(j, tool)), *s))
        for prev, cur in zip(spans, spans[1:]):  # a separator both neighbours could claim goes to the first
            if cur.start < prev.end:
                cur.start = min(prev.end, cur.end)
        if block is None and spans:  # the template moved more than the tools: their hull
            block = (min(x.start for x in spans), max(x.end for x in spans))
        if block:
            spans.insert(0, FieldSpan(SectionPath.of(TOOLS), *block))
        return spans

    def _tools_context(
        self, body: dict[str, Any], text: str, block: tuple[int, int] | None
    ) -> tuple[dict[str, Any], str, int]:
        """The request cut to its first messages, as few as render the text of the whole request through
        the tools block and a little past it, that render, and how far it is the whole request's text.
        Each tool is then left out of a prompt of a few turns, not of the whole conversation (40 tools
        and 200 messages: 42 renders of 1.5 ms each, and as many scans of the whole text). It gives
        the whole request's answer for a template that writes its tools before the messages and from
        nothing the messages read (`tools_written_first`): leaving a tool out of the whole request then
        leaves one run where it leaves one from the cut, decided where the two texts agree (a tool
        whose run is decided further in is left out of the whole request instead). The whole request
        itself for any other template, or when leaving out every tool changes more than one run."""
        from tokendiff.sources.templates.env import tools_written_first

        messages = body.get("messages")
        if block is None or not isinstance(messages, list) or not tools_written_first(self.template):
            return body, text, len(text)
        m = 1
        while m < len(messages):
            short = dict(body, messages=messages[:m])
            got = self._render_quiet(short)
            if got is not None:
                agree = shared_prefix(got, text)
                if agree >= block[1] + TOOLS_MARGIN:
                    return short, got, agree
            m *= 2
        return body, text, len(text)

    def _render_quiet(self, body: dict[str, Any]) -> str | None:
        try:
            return self.render(body)
        except InputError:
            return None

    def _message_spans(self, spans: list[FieldSpan]) -> list[FieldSpan]:
        """Parent spans: a tool call covers its fields; a tool's fields sit in its span."""
        out = []
        groups: dict[SectionPath, list[FieldSpan]] = {}
        for s in spans:
            if len(s.path) >= 3 and s.path[0].kind == K.MESSAGE:  # message › tool call › field
                groups.setdefault(s.path[:2], []).append(s)
        for path, members in groups.items():
            out.append(FieldSpan(path, min(m.start for m in members), max(m.end for m in members)))
        return out


MEDIA_MARKER = "<__media__>"  # llama-server's text for an image or audio part (mtmd_default_marker)
_TEXT_PARTS = ("text", "input_text")
_MEDIA_PARTS = ("image_url", "input_audio", "image", "input_image")


def _server_context() -> dict[str, Any]:
    """What llama-server gives every template besides the request (tests/live/test_breaks.py): thinking on
    (R1's and QwQ's templates close the think block unless `enable_thinking`; DeepSeek V3.1's reads it as
    `thinking`) and today's date as `date_string` (Llama 3.1's 'Today Date'; its own default is 2024's), the
    day a recorded request was sent (`env.rendered_at`). The request's chat_template_kwargs override both;
    a request to another server (vLLM) gets neither."""
    from tokendiff.sources.templates.env import for_llama_server, strftime_now

    if not for_llama_server():
        return {}  # vLLM renders with transformers: the request alone
    return {"enable_thinking": True, "date_string": strftime_now("%d %b %Y")}


def _rendered_role(role: Any) -> Any:
    """The role a message is rendered with: llama-server hands every template a developer message as a system
    one (`Renderer._for_template`), so its sections are the system prompt's (`_msg_part`, `_message_leaves`)."""
    return "system" if role == "developer" else role  # by ==: a hostile role may be a list


def _may_hold_parts(messages: list[dict[str, Any]]) -> bool:
    """Whether some message may have list content or none, or the developer role (`Renderer._for_template`
    joins or types it, makes it empty, makes it a system message): False only when every message is a plain
    dict, no content is a list, null or missing, and no role is developer (looked at in C)."""
    if set(map(type, messages)) != {dict}:
        return True
    if "developer" in list(map(dict.get, messages, repeat("role"))):  # by ==: a hostile role may be a list
        return True
    kinds = set(map(type, map(dict.get, messages, repeat("content"))))
    return any(issubclass(kind, list) or kind is type(None) for kind in kinds)


def checked_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's messages, refused unless a non-empty list of objects."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise InputError("request has no messages list")
    if not messages:
        raise InputError("request has an empty messages list: nothing to render")
    if set(map(type, messages)) == {dict}:
        return messages  # every one a plain dict, looked at in C
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise InputError(f"messages[{i}] is a {type(m).__name__}, not a message object")
    return messages


def part_texts(parts: list[Any], where: str) -> list[str]:
    """The text of each content part, as llama-server reads them: text parts as they are, image and
    audio parts as the media marker; any other part is an error naming it."""
    out = []
    for j, part in enumerate(parts):
        kind = part.get("type", "text") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            out.append(part["text"])
        elif kind in _MEDIA_PARTS:
            out.append(MEDIA_MARKER)
        else:
            raise InputError(f"{where}[{j}] is not a text, image or audio part ({_describe(part)})")
    return out


def _describe(part: Any) -> str:
    if not isinstance(part, dict):
        return f"a {type(part).__name__}"
    kind = part.get("type")
    return f"type {kind!r}" if isinstance(kind, str) else "no type and no text string"


def normalize_tools(body: dict[str, Any]) -> dict[str, Any]:
    """Tools in the standard shape (`{"type": "function", "function": {...}}`): bare function objects
    and the legacy `functions` field wrapped. The same object when nothing needs changing."""
    tools = body.get("tools")
    legacy = not tools and isinstance(body.get("functions"), list) and bool(body["functions"])
    if legacy:
        tools = body["functions"]
    if not isinstance(tools, list) or not tools:
        return body
    if not legacy and all(not _bare_function(t) for t in tools):
        return body
    wrapped = [{"type": "function", "function": t} if _bare_function(t) else t for t in tools]
    return {**{k: v for k, v in body.items() if k != "functions"}, "tools": wrapped}


def _bare_function(tool: Any) -> bool:
    return isinstance(tool, dict) and "function" not in tool and isinstance(tool.get("name"), str)


_THINK_OPEN = re.compile(r"<think>\s*$")
_THINK_CLOSE = re.compile(r"^\s*</think>\n*")


_Marks = tuple[np.ndarray, np.ndarray]  # the sentinels' codes, and their positions in the text without them


def _marks(out: str, sent: _Sentinels) -> tuple[_Marks, str]:
    """The sentinels of a render (codes, positions in the text without them: a sentinel's index less the
    sentinels before it), and that text. In numpy: 100,000 fields are 400,000 sentinels."""
    codes = np.frombuffer(out.encode("utf-32-le", "surrogatepass"), dtype="<u4")
    found = np.flatnonzero((codes >= sent.start) & (codes <= sent.last))
    if not found.size:
        return (found, found), out
    marks = codes[found].astype(np.int64), found - np.arange(len(found))
    kept = np.ones(len(codes), dtype=bool)
    kept[found] = False
    text = codecs.decode(codes[kept].data, "utf-32-le", "surrogatepass")  # no copy of the kept codes to bytes
    return marks, text


def _sentinel_spans(marks: _Marks, leaves: list[_Leaf], sent: _Sentinels) -> tuple[list[FieldSpan], int | None]:
    """Where each wrapped leaf landed, from the sentinels' codes and positions in the text without them;
    a field rendered twice is two spans. Second, where the generation prompt begins, if marked once."""
    codes, pos = marks
    gen = codes == GEN_AT if sent.marked else np.zeros(len(codes), dtype=bool)
    k = codes[~gen] - sent.start
    closing = k >= sent.per_render
    return _spans_at(np.where(closing, k - sent.per_render, k), closing, pos[~gen], leaves), _gen_at(pos[gen])


def _paired_spans(marks: _Marks, leaves: list[_Leaf], sent: _Sentinels) -> tuple[list[FieldSpan], int | None] | None:
    """`_sentinel_spans` of a render wrapped two characters each side: None unless every sentinel is
    whole (its two characters side by side, in order, nothing between them), as a template that shows
    its fields as given writes them."""
    codes, pos = marks
    gen = codes == GEN_AT if sent.marked else np.zeros(len(codes), dtype=bool)
    at = np.flatnonzero(~gen)  # where the sentinels' characters are among all the marks
    if len(at) % 2 or not (np.array_equal(at[1::2] - at[0::2], np.ones(len(at) // 2, dtype=at.dtype))):
        return None
    hi, lo, b = codes[at[0::2]] - sent.start, codes[at[1::2]] - sent.start, sent.base
    opening = (hi < b) & (lo >= b) & (lo < 2 * b)
    closing = (hi >= 2 * b) & (hi < 3 * b) & (lo >= 3 * b) & (lo < 4 * b)
    if not np.array_equal(pos[at[0::2]], pos[at[1::2]]) or not (opening | closing).all():
        return None
    k = np.where(closing, (hi - 2 * b) * b + lo - 3 * b, hi * b + lo - b)
    return _spans_at(k, closing, pos[at[0::2]], leaves), _gen_at(pos[gen])


def _gen_at(marked: np.ndarray) -> int | None:
    return int(marked[0]) if len(marked) == 1 else None


def _spans_at(k: np.ndarray, closing: np.ndarray, pos: np.ndarray, leaves: list[_Leaf]) -> list[FieldSpan]:
    """The spans of the leaves from their sentinels (leaf, whether closing, position, in the order written):
    a leaf's n-th opening with its n-th closing, where both are and the closing is not before, in the
    leaves' order and then the order written."""
    keep = k < len(leaves)
    k, closing, pos = k[keep], closing[keep], pos[keep]
    m = len(k) + 1  # more than any leaf's sentinels: (leaf, rank) as one key
    opens, closes = _ranked(k[~closing], pos[~closing], m), _ranked(k[closing], pos[closing], m)
    _, i, j = np.intersect1d(opens[0], closes[0], assume_unique=True, return_indices=True)
    field, start, end = opens[1][i], opens[2][i], closes[2][j]
    ok = end >= start
    paths = [leaves[x].path for x in field[ok].tolist()]
    return [FieldSpan(p, s, e) for p, s, e in zip(paths, start[ok].tolist(), end[ok].tolist())]


def _ranked(k: np.ndarray, pos: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(a key for each sentinel, its leaf times `m` plus how many of the leaf's came before it; the leaf;
    its position), sorted by that key."""
    order = np.argsort(k, kind="stable")
    k, pos = k[order], pos[order]
    first = np.flatnonzero(np.r_[True, k[1:] != k[:-1]]) if len(k) else np.zeros(0, dtype=np.int64)
    rank = np.arange(len(k)) - np.repeat(first, np.diff(np.r_[first, len(k)]))
    return k * m + rank, k, pos


def _with_think_tags(text: str, sp: FieldSpan) -> FieldSpan:
    """A reasoning field owns the <think>...</think> wrapper the template puts around it."""
    if sp.path[-1].kind != K.REASONING:
        return sp
    before = _THINK_OPEN.search(text, max(0, sp.start - 24), sp.start)
    after = _THINK_CLOSE.match(text[sp.end : sp.end + 24])
    if before and after:
        return FieldSpan(sp.path, before.start(), sp.end + after.end())
    return sp


def _chunks(items: list[Any], n: int) -> list[list[Any]]:
    return [items[i : i + n] for i in range(0, len(items), n)] or [[]]


def _nonempty(v: Any) -> bool:
    return isinstance(v, str) and bool(v.strip())


def _rotate(s: str) -> str:
    """The same string with every letter and digit moved on by one: same length, same shape."""

    def rot(c: str) -> str:
        if "a" <= c <= "y" or "A" <= c <= "Y" or "0" <= c <= "8":
            return chr(ord(c) + 1)
        if c in "zZ9":
            return {"z": "a", "Z": "A", "9": "0"}[c]
        return c

    return "".join(rot(c) for c in s)


def _removed_span(full: str, shorter: str | None, snap: bool) -> tuple[int, int] | None:
    """Where `full` has the characters that `shorter` lacks (one deleted run).

    A deleted run can slide over text its neighbours share; `snap` picks the
    placement starting at a line start or at `{`, `[` or `<`, else the leftmost.
    """
    return _removed_run(full, shorter, snap)[0]


def _removed_run(full: str, shorter: str | None, snap: bool) -> tuple[tuple[int, int] | None, int]:
    """`_removed_span`, and how far into `full` (and `shorter`, shifted) the answer reads: a text that
    agrees with `full` that far, less the deleted run from another, gives the same answer."""
    if shorter is None or len(shorter) >= len(full):
        return None, len(full) + 1
    n = len(full) - len(shorter)
    lim = len(shorter)
    p = shared_prefix(full, shorter)
    s = shared_suffix(full, shorter)
    reach = p + n + 1  # the prefix stopped at full[p + n]; the suffix and the placements read no further
    # placements q with full[:q] == shorter[:q] and full[q+n:] == shorter[q:]
    left, right = max(0, len(full) - s - n), min(p, lim)
    if left > right:
        return None, reach  # not a single deleted run: the template restructured
    if not snap:
        return (left, left + n), reach
    right = min(right, left + 4000)
    depth = _min_depths(full, left, right, n)
    best = max(depth)
    balanced = [left + r for r, low in enumerate(depth) if low == best]
    checks: tuple[Callable[[int], bool], ...] = (
        lambda q: (q == 0 or full[q - 1] == "\n") and not full[q].isspace(),
        lambda q: (m := _FIRST_AFTER_SEPARATORS.match(full, q, q + n)) is not None and m.group(1) in "{[<",
        lambda q: True,
    )
    for ok in checks:
        for q in balanced:
            if ok(q):
                return (q, q + n), reach
    return (left, left + n), reach


_FIRST_AFTER_SEPARATORS = re.compile(r"[ \n,]*(.)", re.DOTALL)
_OPENING = np.array([ord(c) for c in "([{"], dtype=np.uint32)
_CLOSING = np.array([ord(c) for c in ")]}"], dtype=np.uint32)


def _min_depths(text: str, left: int, right: int, n: int) -> list[int]:
    """For each q in [left, right], the lowest bracket depth reached in text[q:q+n], relative to its
    start (0 for a well-formed piece). One pass of running depths and a sliding minimum instead of a
    walk over each window: a long tool that can slide far made that walk quadratic."""
    codes = np.frombuffer(text[left : right + n].encode("utf-32-le", "surrogatepass"), dtype="<u4")
    steps = np.isin(codes, _OPENING).astype(np.int64) - np.isin(codes, _CLOSING)
    depth = np.concatenate(([0], np.cumsum(steps)))  # depth[i]: after the first i characters
    # window r (q = left + r) reaches depth[r + 1 .. r + n]; depth only falls at a closing bracket
    lows = _sliding_min(depth[1:], n) - depth[: right - left + 1]
    found: list[int] = np.minimum(lows, 0).tolist()
    return found


def _sliding_min(x: np.ndarray, w: int) -> np.ndarray:
    """min(x[i:i+w]) for every i (van Herk / Gil-Werman: prefix and suffix minima of w-blocks)."""
    m = len(x) - w + 1
    padded = np.concatenate((x, np.full(-len(x) % w, x.max(), dtype=x.dtype))).reshape(-1, w)
    prefix = np.minimum.accumulate(padded, axis=1).ravel()
    suffix = np.minimum.accumulate(padded[:, ::-1], axis=1)[:, ::-1].ravel()
    return np.minimum(suffix[:m], prefix[w - 1 : w - 1 + m])


TOOLS = Part(K.TOOLS, field="tools")
TOOLS_MARGIN = 256  # characters past the tools block a cut request must render as the whole does
_REASONING_FIELDS = ("reasoning_content", "reasoning", "thinking")


def _function_name(item: Any) -> str | None:
    """The name of a tool or tool call (`{"function": {"name": ...}}` or flat)."""
    if not isinstance(item, dict):
        return None
    fn = item.get("function") if isinstance(item.get("function"), dict) else item
    name = fn.get("name") if isinstance(fn, dict) else None
    return name if isinstance(name, str) else None


def _tool_part(j: int, tool: Any) -> Part:
    return Part(K.TOOL, j, _function_name(tool), f"tools[{j}]")


def _call_part(i: int, k: int, call: Any) -> Part:
    return Part(K.TOOL_CALL, k, _function_name(call), f"messages[{i}].tool_calls[{k}]")


def _msg_part(i: int, m: dict[str, Any]) -> Part:
    role = _rendered_role(m.get("role"))
    return Part(K.MESSAGE, i, role if isinstance(role, str) else None, f"messages[{i}]")


def _field_part(path: str, short: str) -> Part:
    """A leaf field: reasoning is its own kind (the grammar finds it too), the rest are fields."""
    return Part(K.REASONING if short in _REASONING_FIELDS else K.FIELD, name=short, field=path)


def _leaf(base: SectionPath, field_path: str, short: str, *keys: Any) -> _Leaf:
    """The string at body[keys[0]][keys[1]]..., located as `base` › the field."""
    return _Leaf(base + (_field_part(field_path, short),), keys)


@lru_cache(maxsize=8192)
def _message_field(i: int, role: str | None, fld: str) -> _Leaf:
    """messages[i].fld of a message with this role: made once per session."""
    base = SectionPath.of(Part(K.MESSAGE, i, role, f"messages[{i}]"))
    return _leaf(base, f"messages[{i}].{fld}", fld, "messages", i, fld)


def _message_leaves(i: int, m: dict[str, Any]) -> list[_Leaf]:
    role = _rendered_role(m.get("role"))
    role = role if isinstance(role, str) else None
    field = _message_field if role is None or len(role) <= 32 else _message_field.__wrapped__  # a long role: not kept
    out: list[_Leaf] = []
    content = m.get("content")
    if isinstance(content, str):
        out.append(field(i, role, "content"))
    elif isinstance(content, list):
        base = SectionPath.of(_msg_part(i, m))
        for j, part in enumerate(content):
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                path = f"messages[{i}].content[{j}].text"
                out.append(_leaf(base, path, f"content[{j}]", "messages", i, "content", j, "text"))
    out += [field(i, role, fld) for fld in (*_REASONING_FIELDS, "tool_call_id", "name") if isinstance(m.get(fld), str)]
    calls = m.get("tool_calls")
    if isinstance(calls, list) and calls:
        base = SectionPath.of(_msg_part(i, m))
        for k, call in enumerate(calls):
            if isinstance(call, dict):
                out += _call_leaves(base + (_call_part(i, k, call),), i, k, call)
    return out


def _call_leaves(cbase: SectionPath, i: int, k: int, call: dict[str, Any]) -> list[_Leaf]:
    out: list[_Leaf] = []
    at = ("messages", i, "tool_calls", k)
    pre = f"messages[{i}].tool_calls[{k}]"
    if isinstance(call.get("id"), str):
        out.append(_leaf(cbase, f"{pre}.id", "id", *at, "id"))
    fn = call.get("function")
    if not isinstance(fn, dict):
        return out
    if isinstance(fn.get("name"), str):
        out.append(_leaf(cbase, f"{pre}.function.name", "name", *at, "function", "name"))
    args = fn.get("arguments")
    if isinstance(args, str):
        out.append(_leaf(cbase, f"{pre}.function.arguments", "arguments", *at, "function", "arguments"))
    elif isinstance(args, dict):  # parsed arguments (as llama-server templates them): each string value
        for ak, av in args.items():
            if isinstance(av, str):
                out.append(_leaf(cbase, f"{pre}.function.arguments", "arguments", *at, "function", "arguments", ak))
    return out


def _leaves(body: dict[str, Any]) -> list[_Leaf]:
    """Every string field whose text a template may show, with a getter and setter."""
    leaves: list[_Leaf] = []
    messages, tools = body.get("messages"), body.get("tools")  # what the template refuses: no leaves
    for i, m in enumerate(messages if isinstance(messages, list) else []):
        if isinstance(m, dict):
            leaves += _message_leaves(i, m)
    for j, tool in enumerate(tools if isinstance(tools, list) else []):
        if not isinstance(tool, dict) or not isinstance(tool.get("function"), dict):
            continue
        tbase = SectionPath.of(TOOLS, _tool_part(j, tool))
        for fld in ("name", "description"):
            if isinstance(tool["function"].get(fld), str):
                leaves.append(_leaf(tbase, f"tools[{j}].function.{fld}", fld, "tools", j, "function", fld))
    return leaves
