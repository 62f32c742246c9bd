"""`grammar.sections_for` against the token-at-a-time version it replaced (a dict of each special token's
hits, a `_Span` and two bisects per span, a sort by key), on every fixture template's render and on random
prompts of every family's markers: split into random tokens (empty ones too), markers special or not,
offsets and flags as stdlib and numpy arrays."""

from __future__ import annotations

import random
import re
from array import array
from bisect import bisect_left, bisect_right

import numpy as np
import pytest
from prompts import CONVERSATION, TEMPLATES, TOOLS, render

from tokendiff.core import grammar
from tokendiff.core.kinds import SectionKind as K
from tokendiff.core.model import Part, Prompt, Section, SectionPath, flag_indices
from tokendiff.sources.tokenizers import load_vocab, text_tokenizer


class _OldMarks:
    def __init__(self, prompt: Prompt):
        self.data = data = prompt.data
        offs = prompt.offsets
        self.specials: dict[bytes, list[tuple[int, int]]] = {}
        for i in flag_indices(prompt.special):
            a, b = int(offs[i]), int(offs[i + 1])
            self.specials.setdefault(data[a:b], []).append((a, b))

    def find(self, text: str) -> list[tuple[int, int]]:
        raw = text.encode()
        hits = self.specials.get(raw)
        if hits:
            return list(hits)
        return [(m.start(), m.end()) for m in re.finditer(re.escape(raw), self.data)]

    def starts(self, text: str) -> list[int]:  # what the splitters read now, as the old splitters made it
        return [s for s, _ in self.find(text)]

    def ends(self, text: str) -> list[int]:
        return [e for _, e in self.find(text)]


def _old_split_generic(marks, start_marker, end_markers, role_end):  # type: ignore[no-untyped-def]
    data = marks.data
    starts = [s for s, _ in marks.find(start_marker)]
    ends = sorted(e for m in end_markers for _, e in marks.find(m))
    skip = len(start_marker.encode())
    enders = [m.encode() for m in end_markers]
    turns = []
    for k, s in enumerate(starts):
        limit = starts[k + 1] if k + 1 < len(starts) else len(data)
        role, cstart = role_end(data, s + skip)
        cstart = min(cstart, limit)
        j = bisect_left(ends, cstart)
        close = ends[j] if j < len(ends) and ends[j] <= limit else None
        if close is not None:
            marker_len = (
                len(enders[0])
                if len(enders) == 1
                else next(len(m) for m in enders if data[close - len(m) : close] == m)
            )
            content_end = close - marker_len
        else:
            content_end = limit
        turns.append(grammar._Turn(role, s, limit, cstart, content_end, close is not None))
    return turns


def _old_sections_for(prompt: Prompt, family: str | None = None, inner: bool = True) -> tuple[str, list[Section]]:
    new_split = grammar._split_generic
    grammar._split_generic = _old_split_generic  # what the family splitters call
    try:
        return _old_sections(prompt, family, inner)
    finally:
        grammar._split_generic = new_split


def _old_sections(prompt: Prompt, family: str | None, inner: bool) -> tuple[str, list[Section]]:
    marks = _OldMarks(prompt)
    fam = family or (grammar.family_of_specials(marks.specials.keys()) or grammar._family_of_text(marks.data))
    if fam not in grammar._SPLITTERS:
        return "none", []
    turns = grammar._SPLITTERS[fam](marks)  # type: ignore[arg-type]  # the splitters read data and find()
    spans = []
    if turns and turns[0].start > 0:
        spans.append((SectionPath.of(Part(K.BOS)), 0, turns[0].start))
    index = 0
    for i, t in enumerate(turns):
        if t.role == "tools":
            path = SectionPath.of(Part(K.TOOLS))
        elif i == len(turns) - 1 and not t.closed and t.role.startswith("assistant"):
            path = SectionPath.of(Part(K.GENERATION_PROMPT))
        else:
            path = SectionPath.of(Part(K.MESSAGE, index, t.role))
        if t.role != "tools":
            index += 1
        spans.append((path, t.start, t.end))
        if path[0].kind == K.GENERATION_PROMPT:
            if t.content_start < t.end:
                generated = path + (Part(K.GENERATED),)
                spans.append((generated, t.content_start, t.end))
                spans.extend(grammar._inner_spans(prompt.data, t, generated, fam) if inner else ())
            continue
        spans.extend(grammar._inner_spans(prompt.data, t, path, fam) if inner else ())
    offs, n, out = prompt.offsets, len(prompt), []
    for path, s, e in spans:
        a = max(0, min(bisect_right(offs, s) - 1, n))
        b = max(a, min(bisect_right(offs, max(e - 1, s)), n))
        if e > s:
            out.append(Section(path, a, b, s, e))
    out.sort(key=lambda x: (x.start, -x.end, len(x.path.parts)))
    return fam, out


_MARKERS = [
    "<|im_start|>",
    "<|im_end|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|start|>",
    "<|message|>",
    "<|end|>",
    "<|call|>",
    "<|return|>",
    "<|channel|>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<bos>",
    "<｜begin▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜end▁of▁sentence｜>",
    "<｜tool▁outputs▁begin｜>",
    "<｜tool▁outputs▁end｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[TOOL_CALLS]",
    "[CALL_ID]",
    "[ARGS]",
    "[TOOL_CONTENT]",
    "</s>",
]
_TEXT = [
    "user\n",
    "assistant\n",
    "system\n",
    "tool\n",
    "tools\n",
    "ipython\n",
    "model\n",
    "assistant<|channel|>analysis",
    " to=functions.get_x",
    "\n\n",
    "hello ",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<tools>",
    "</tools>",
    '{"type": "function", "function": {"name": "f"}}',
    '{"name": "g", "id": "abc", "arguments": {"id": "no"}}',
    '"call_id": "c1"',
    "Today Date: 26 Jul 2024\n",
    "namespace functions {\ntype f = () => any;\n} // namespace functions",
    "get_x[CALL_ID]",
    "abc123[ARGS]{}",
    "{",
    "}",
    '"',
    "\\",
    "é",
    "日本",
    "",
]


def _tokenise(text: str, markers: set[str], rng: random.Random) -> list[tuple[bytes, bool]]:
    """`text` as (piece, special) tokens: the given markers one special token each, other text in
    random chunks (an empty token now and then, a multi-byte character split across two)."""
    out: list[tuple[bytes, bool]] = []
    pattern = "(" + "|".join(map(re.escape, sorted(markers, key=len, reverse=True))) + ")" if markers else None
    for k, part in enumerate(re.split(pattern, text) if pattern else [text]):
        if k % 2:
            if rng.random() < 0.05:  # an empty special token before a marker
                out.append((b"", True))
            out.append((part.encode(), True))
            continue
        raw = part.encode()
        i = 0
        while i < len(raw):
            j = i + rng.choice([0, 1, 2, 3, 5, 8, 40])
            out.append((raw[i:j], rng.random() < 0.02 and i == j))  # an empty special token in text
            i = max(i, j)
    return out


def _prompt(tokens: list[tuple[bytes, bool]], numpy_arrays: bool) -> Prompt:
    offsets = [0]
    for piece, _ in tokens:
        offsets.append(offsets[-1] + len(piece))
    flags = [int(s) for _, s in tokens]
    ids = array("i", range(len(tokens)))
    if numpy_arrays:
        return Prompt(
            ids=ids,
            data=b"".join(p for p, _ in tokens),
            offsets=np.array(offsets, dtype=np.int64),
            special=np.array(flags, dtype=bool),
        )
    return Prompt(ids=ids, data=b"".join(p for p, _ in tokens), offsets=array("q", offsets), special=array("B", flags))


def _same(p: Prompt) -> None:
    for family in (None, *grammar._SPLITTERS, "none"):
        for inner in (True, False):
            old, new = _old_sections_for(p, family, inner), grammar.sections_for(p, family, inner)
            assert old == new, (family, inner, p.data[:200])
            assert all(type(x) is int for s in new[1] for x in s[1:]), "token and byte offsets are plain ints"
    marks, old_marks = grammar._Marks(p), _OldMarks(p)
    for m in _MARKERS + ["user", "<think>"]:
        assert marks.find(m) == old_marks.find(m)
        assert marks.starts(m) == [s for s, _ in old_marks.find(m)]
        assert marks.ends(m) == [e for _, e in old_marks.find(m)]


_TEMPLATE_KW = {
    "deepseek-ai-DeepSeek-V3.1.jinja": {"bos_token": "<｜begin▁of▁sentence｜>"},
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": {"bos_token": "<｜begin▁of▁sentence｜>"},
    "google-gemma-2-2b-it.jinja": {"bos_token": "<bos>"},
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": {"bos_token": "<s>"},
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": {"bos_token": "<s>"},
}


def _renders() -> list[str]:
    out = []
    for path in sorted(TEMPLATES.glob("*.jinja")):
        kw = _TEMPLATE_KW.get(path.name, {})
        for msgs, tools in ((CONVERSATION, TOOLS), (CONVERSATION[1:2], None)):
            try:
                out.append(render(path.name, msgs, tools, **kw))
            except Exception:  # a template that refuses this conversation (Gemma: no system role) is skipped
                continue
    return out


def test_fixture_templates_section_as_before():
    renders = _renders()
    assert len(renders) >= 14
    rng = random.Random(7)
    for text in renders:
        for seed in range(6):
            special = {m for m in _MARKERS if rng.random() < (1.0 if seed < 2 else 0.6)}
            _same(_prompt(_tokenise(text, special, rng), numpy_arrays=seed % 2 == 1))


@pytest.mark.parametrize("seed", range(12))
def test_random_prompts_section_as_before(seed):
    rng = random.Random(seed)
    for _ in range(60):
        pieces = [rng.choice(_MARKERS) if rng.random() < 0.35 else rng.choice(_TEXT) for _ in range(rng.randint(0, 80))]
        special = {m for m in _MARKERS if rng.random() < 0.7}
        _same(_prompt(_tokenise("".join(pieces), special, rng), numpy_arrays=rng.random() < 0.3))


@pytest.mark.parametrize("seed", range(4))
def test_special_bounds_numpy_as_stdlib(seed, monkeypatch):
    """`_Marks` reads the special tokens' bounds in numpy calls where the process has numpy (a report's): the same
    lists as the stdlib `map`s (`tokendiff diff`'s path), and the same token maps (made when asked for), on random
    prompts with empty special tokens, a special first token, flags as stdlib, numpy and byte strings and offsets as
    stdlib, numpy and list."""
    rng = random.Random(seed)
    for _ in range(150):
        pieces = [rng.choice(_MARKERS) if rng.random() < 0.35 else rng.choice(_TEXT) for _ in range(rng.randint(0, 60))]
        special = {m for m in _MARKERS if rng.random() < 0.7}
        p = _prompt(_tokenise("".join(pieces), special, rng), numpy_arrays=rng.random() < 0.5)
        as_bytes = Prompt(ids=p.ids, data=p.data, offsets=list(map(int, p.offsets)), special=bytes(p.special))
        for q in (p, as_bytes):
            want = [list(x) for x in grammar._special_bounds(q)]
            arrays = grammar._special_arrays(q)
            assert arrays is not None
            got = [x.tolist() for x in arrays]
            assert got == want
            assert all(type(x) is int for x in got[0] + got[1] + got[2])
            with_np = grammar._Marks(q)
            with monkeypatch.context() as m:
                m.setattr(grammar, "_special_arrays", lambda _: None)
                stdlib = grammar._Marks(q)
            assert with_np.arrays is not None and stdlib.arrays is None
            assert (with_np.first_token, with_np.token_from) == (stdlib.first_token, stdlib.token_from)
            offs = list(map(int, q.offsets))
            for x, t in stdlib.first_token.items():
                assert t == bisect_right(offs, x) - 1
            for x, t in stdlib.token_from.items():
                assert t == bisect_left(offs, x)


# ChatML sectioning in numpy calls (`grammar._chatml_sections`) against the turn-at-a-time loop it stands in for
# (`grammar._loop_sections`) and the token-at-a-time version before both (`_old_sections_for`): random ChatML
# conversations (system, user, assistant, tool and odd roles, reasoning, tool calls, results and ID keys, `<tools>`
# blocks, '<' in prose, open and empty last turns, text before the first turn, headers without a newline in reach,
# stray and missing end markers) split into random tokens (empty ones too), offsets and flags as stdlib and numpy
# arrays; and the real Qwen3 tokenizer's decode.

_CHATML_ROLES = ["system", "user", "assistant", "tool", "user ", " assistant", "ipython", "model", "日本", ""]
_BODIES = [
    "hello there",
    "a < b and c > d",
    "<think>\nmull it over\n</think>\n\nthe answer",
    "<think>\n\n</think>\n\n",
    '<tool_call>\n{"name": "get_x", "arguments": {"id": "no"}}\n</tool_call>',
    '<tool_response>\n{"call_id": "c1", "out": 3}\n</tool_response>',
    '<tools>\n{"type": "function", "function": {"name": "f"}}\n</tools>',
    '{"id": "abc", "tool_call_id": "t9"}',
    "[TOOL_RESULTS]r1[TOOL_CONTENT]done",
    "line one\nline two\n",
    "é" * 3,
    "",
]


def _conversation(rng: random.Random) -> str:
    out = ["<bos>junk " if rng.random() < 0.2 else ""]
    for k in range(rng.randint(0, 12)):
        role = rng.choice(_CHATML_ROLES) if rng.random() < 0.98 else "tools"  # a `tools` turn: the loop takes it
        head = role + ("\n" if rng.random() < 0.98 else "x" * rng.choice([5, 300]))  # 300: no newline in reach
        body = "".join(rng.choice(_BODIES) for _ in range(rng.randint(0, 3)))
        close = "<|im_end|>\n" if rng.random() < 0.9 or k == 0 else ""
        out.append(f"<|im_start|>{head}{body}{close}")
    if rng.random() < 0.5:
        out.append("<|im_start|>assistant\n" + rng.choice(["", "<think>\n", "<think>\nhm</think>\n\nok<|im_end|>"]))
    if rng.random() < 0.05:
        out.append("<|im_end|>")  # a stray end marker
    return "".join(out)


def _both(p: Prompt) -> int:
    """The numpy path (where it takes the prompt) against the loop and the old version; 1 where it took it."""
    took = 0
    for inner in (True, False):
        marks = grammar._Marks(p)
        loop = grammar._loop_sections(p, marks, "chatml", inner)
        assert marks.arrays is not None
        fast = grammar._chatml_sections(p, marks, marks.arrays, inner)
        if fast is not None:
            took = 1
            assert fast == loop, (inner, p.data[:300])
            assert all(type(x) is int for s in fast for x in s[1:]), "token and byte offsets are plain ints"
        assert grammar.sections_for(p, None, inner) == _old_sections_for(p, None, inner)
    return took


@pytest.mark.parametrize("seed", range(10))
def test_chatml_numpy_sections_as_the_loop(seed):
    rng = random.Random(seed)
    took = 0
    for _ in range(120):
        special = {"<|im_start|>", "<|im_end|>"} if rng.random() < 0.9 else {"<|im_start|>"}
        if rng.random() < 0.3:
            special.add("<bos>")
        took += _both(_prompt(_tokenise(_conversation(rng), special, rng), numpy_arrays=rng.random() < 0.3))
    assert took >= 60  # the numpy path took most of them


def test_chatml_numpy_sections_on_qwen3_decodes():
    """Qwen3's own tokens: its decode's stdlib arrays, the markers one special token each."""
    vocab = load_vocab(None)
    tok = text_tokenizer(vocab)
    rng = random.Random(5)
    took = 0
    for _ in range(60):
        ids = np.asarray(tok.encode(_conversation(rng)), dtype=np.int32)
        data, offsets, special = vocab.decode(ids)
        took += _both(Prompt(ids=ids, data=data, offsets=offsets, special=special))
    assert took >= 30
