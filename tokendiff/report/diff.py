"""`tokendiff diff` output: a stable JSON document and its text rendering.

The text view is rendered from the JSON document, so the two never disagree.
The schema is documented in docs/diff-json.md; bump SCHEMA on any change
that removes or renames a field.
"""

from __future__ import annotations

from tokendiff.core.model import END_OF_PROMPT, LOCAL_RENDER_IDS, Divergence, Finding, Prompt, SectionPath
from tokendiff.core.rounding import counted, percent_text
from tokendiff.core.vocab import Vocab
from tokendiff.report.excerpt import excerpt

try:
    from _json import encode_basestring as _quoted  # json's escaping of a string (ensure_ascii=False), in C
except ImportError:  # an interpreter without json's accelerator: its Python version, as json uses then
    from json.encoder import py_encode_basestring as _quoted

TYPE_CHECKING = False  # no `typing` at run time: `tokendiff diff` imports this module (core/plain.py)
if TYPE_CHECKING:  # the types cost nothing at run time: `tokendiff diff` imports this module
    from typing import Any, Final

    from tokendiff.report.schema import (
        DiffDocument,
        Excerpt,
        FindingDoc,
        FirstDivergence,
        HunkDoc,
        HunkSide,
        PathPart,
        PromptSide,
    )

SCHEMA: Final = "tokendiff.diff/2"


def _side(p: Prompt) -> PromptSide:
    m = p.meta
    mm = m.render_mismatch
    return {
        "origin": p.origin,
        "path": m.path,
        "format": m.format,
        "n_tokens": len(p),
        "n_bytes": len(p.data),
        "template_family": m.template_family,
        "state_bytes": m.state_bytes,
        "ids_from": m.ids_from,
        "sections_from": m.sections_from,
        "render_mismatch": {"byte": mm.byte, "local": mm.local, "server": mm.server} if mm else None,
    }


def _finding(f: Finding | None) -> FindingDoc | None:
    if f is None:
        return None
    return {
        "kind": f.kind,
        "title": f.title,
        "evidence": f.evidence,  # masked where every finding is made (causes.finding)
        "fix": f.fix,
        "confidence": f.confidence,
        "expected": f.expected,
        "origin": f.origin,
    }


def path_json(path: SectionPath) -> list[PathPart]:
    """A section path as JSON: its parts, outermost first (docs/diff-json.md)."""
    return [{"kind": p.kind, "index": p.index, "name": p.shown_name, "field": p.field} for p in path]


def _owner_at(p: Prompt, token: int) -> SectionPath:
    return p.owner(token) if token < len(p) else END_OF_PROMPT


def _text(p: Prompt, start: int, end: int, context: int) -> Excerpt:
    e = excerpt(p, start, end, context)
    return {"before": e.before, "diverged": e.diverged, "after": e.after}


def _first_divergence(a: Prompt, b: Prompt, d: Divergence, context: int) -> FirstDivergence:
    """Where the shared prefix ends: the token, its owners on both sides, and the text around it."""
    h = d.hunks[0] if d.hunks else None
    a_end = h.a_end if h else d.lcp
    b_end = h.b_end if h else d.lcp
    # a pure insertion's section is the one it extends (align._insertion_owner), not the next token's
    insert = h is not None and h.a_start == h.a_end == d.lcp < len(a)
    pa, pb = h.a_owner if h is not None and insert else _owner_at(a, d.lcp), _owner_at(b, d.lcp)
    return {
        "token": d.lcp,
        "byte": a.byte_offset(d.lcp),
        "first_byte_diff": d.first_byte_diff,
        "boundary": d.boundary,
        "a_section": pa.label or "(no section)",
        "a_path": path_json(pa),
        "a_field": pa.field_path,
        "b_section": pb.label or "(no section)",
        "b_path": path_json(pb),
        "b_field": pb.field_path,
        "a_token_id": int(a.ids[d.lcp]) if d.lcp < len(a) else None,
        "b_token_id": int(b.ids[d.lcp]) if d.lcp < len(b) else None,
        "a_text": _text(a, d.lcp, a_end, context),
        "b_text": _text(b, d.lcp, b_end, context),
    }


def _hunk_side(
    p: Prompt, tokens: tuple[int, int], byte_range: tuple[int, int], owner: SectionPath, context: int
) -> HunkSide:
    return {
        "tokens": list(tokens),
        "bytes": list(byte_range),
        "section": owner.label or None,
        "path": path_json(owner),
        "text": _text(p, tokens[0], tokens[1], context),
    }


def diff_document(
    a: Prompt, b: Prompt, d: Divergence, vocab: Vocab, context: int = 8, findings: list[Finding] | None = None
) -> DiffDocument:
    best = {f.hunk: f for f in (findings or [])}
    first = None if d.identical else _first_divergence(a, b, d, context)
    hunks: list[HunkDoc] = [
        {
            "kind": h.kind,
            "a": _hunk_side(a, (h.a_start, h.a_end), (h.a_byte_start, h.a_byte_end), h.a_owner, context),
            "b": _hunk_side(b, (h.b_start, h.b_end), (h.b_byte_start, h.b_byte_end), h.b_owner, context),
            "finding": _finding(best.get(i)),
        }
        for i, h in enumerate(d.hunks)
    ]
    return {
        "schema": SCHEMA,
        "identical": d.identical,
        "a": _side(a),
        "b": _side(b),
        "tokenizer": {
            "name": vocab.name,
            "assumed": vocab.assumed,
            "n_vocab": vocab.n_vocab,
            "identity": vocab.identity,
        },
        "lcp_tokens": d.lcp,
        "reusable_fraction": round(d.reuse_fraction, 6),
        "recompute_tokens": d.n_b - min(d.lcp, d.n_b),
        "first_divergence": first,
        "hunks": hunks,
    }


# ---------------------------------------------------------------- text

_RED, _GREEN, _DIM, _BOLD, _CYAN, _RESET = "\x1b[31m", "\x1b[32m", "\x1b[2m", "\x1b[1m", "\x1b[36m", "\x1b[0m"


class _Style:
    def __init__(self, color: bool):
        self.color = color

    def wrap(self, code: str, s: str) -> str:
        return f"{code}{s}{_RESET}" if self.color and s else s

    def mark(self, s: str, side: str) -> str:
        if self.color:
            code = "\x1b[41;97m" if side == "a" else "\x1b[42;30m"
            return f"{code}{s or '∅'}{_RESET}"
        return f"⟦{s}⟧"


def _line(style: _Style, t: Excerpt, side: str) -> str:
    return style.wrap(_DIM, "…" + t["before"]) + style.mark(t["diverged"], side) + style.wrap(_DIM, t["after"] + "…")


def render_text(doc: DiffDocument, color: bool = False, max_hunks: int = 20) -> str:
    st = _Style(color)
    out = _header(st, doc)
    f = doc["first_divergence"]
    if doc["identical"] or f is None:
        out.append(f"identical: {counted(doc['a']['n_tokens'], 'token')}, all reusable")
        return "\n".join(out) + "\n"
    pct = percent_text(doc["lcp_tokens"], doc["b"]["n_tokens"])
    out.append(
        st.wrap(_BOLD, f"reusable prefix: {doc['lcp_tokens']:,} of {counted(doc['b']['n_tokens'], 'token')} ({pct} %)")
        + f" · {doc['recompute_tokens']:,} to recompute"
    )
    out += _first_lines(st, f, doc["hunks"][0]["finding"] if doc["hunks"] else None)
    hunks = doc["hunks"]
    out.append("")
    out.append(f"{len(hunks)} divergent span{'s' if len(hunks) != 1 else ''}:")
    for k, h in enumerate(hunks[:max_hunks], 1):
        out += _hunk_lines(st, k, h)
    if len(hunks) > max_hunks:
        out.append(f"… {len(hunks) - max_hunks} more (--json lists all)")
    return "\n".join(out) + "\n"


def _header(st: _Style, doc: DiffDocument) -> list[str]:
    """Both prompts, any render mismatch, the tokenizer."""
    out: list[str] = []
    a, b = doc["a"], doc["b"]
    out.append(st.wrap(_BOLD, f"A  {a['origin']}") + f"  {a['format']}, {counted(a['n_tokens'], 'token')}")
    out.append(st.wrap(_BOLD, f"B  {b['origin']}") + f"  {b['format']}, {counted(b['n_tokens'], 'token')}")
    for side, d in (("A", a), ("B", b)):
        mm = d.get("render_mismatch")
        if mm and d.get("ids_from") == LOCAL_RENDER_IDS:  # no server: the tokenizer normalised the text
            out.append(
                st.wrap(
                    _DIM,
                    f"{side}: the tokens of the local render spell other bytes at byte {mm['byte']} (the tokenizer "
                    f"normalises the text): render …{mm['local']!r}… tokens …{mm['server']!r}…",
                )
            )
        elif mm:
            out.append(
                st.wrap(
                    _DIM,
                    f"{side}: the local render differs from the server's tokens at byte {mm['byte']}: "
                    f"local …{mm['local']!r}… server …{mm['server']!r}…",
                )
            )
    tk = doc["tokenizer"]
    note = " (assumed; pass --tokenizer or --server for the model's own)" if tk["assumed"] else ""
    out.append(st.wrap(_DIM, f"tokenizer: {tk['name']}{note} · template: {a['template_family']}"))
    out.append("")
    return out


def _first_lines(st: _Style, f: FirstDivergence, finding: FindingDoc | None) -> list[str]:
    """The first divergence: where, both sides' text, its cause and whether it is a tokenization boundary."""
    out = [st.wrap(_BOLD, f"first divergence: token {f['token']:,} · byte {f['byte']:,}")]
    for side, section, fld in (("A", f["a_section"], f["a_field"]), ("B", f["b_section"], f["b_field"])):
        extra = f"   (field {fld})" if fld else ""
        out.append(f"  {side}: {st.wrap(_CYAN, section)}{extra}")
    out.append("  A │ " + _line(st, f["a_text"], "a"))
    out.append("  B │ " + _line(st, f["b_text"], "b"))
    if finding:
        out.append(f"  cause: {st.wrap(_BOLD, finding['title'])}: {finding['evidence']}")
        out.append(f"  fix: {finding['fix']}")
    if f["boundary"]:
        fbd = f["first_byte_diff"]
        where = "the bytes are identical" if fbd is None else f"the bytes agree up to byte {fbd:,}"
        out.append(
            f"  tokenization boundary: token IDs differ at token {f['token']:,} but {where}"
            " (a BPE merge across the boundary, not a content change)"
        )
    return out


def _hunk_lines(st: _Style, k: int, h: HunkDoc) -> list[str]:
    """One divergent span (the k-th, from 1): its ranges, sections, finding (past the first) and text."""
    ha, hb = h["a"], h["b"]
    out = [
        st.wrap(_CYAN, f"@@ {k} {h['kind']}")
        + f"  A tokens {ha['tokens'][0]:,}..{ha['tokens'][1]:,} (bytes {ha['bytes'][0]:,}..{ha['bytes'][1]:,})"
        + f" → B tokens {hb['tokens'][0]:,}..{hb['tokens'][1]:,} (bytes {hb['bytes'][0]:,}..{hb['bytes'][1]:,})"
    ]
    if ha["section"] == hb["section"]:
        out.append(f"   in {ha['section']}")
    else:
        out.append(f"   A in {ha['section']}")
        out.append(f"   B in {hb['section']}")
    finding = h["finding"]
    if finding and k > 1:
        out.append(f"   {finding['title']}: {finding['evidence']}")
    out.append("   - " + _line(st, ha["text"], "a"))
    out.append("   + " + _line(st, hb["text"], "b"))
    return out


def document_json(doc: DiffDocument) -> bytes:
    """The document as `diff --json` prints it: orjson's indented form, newline-terminated.

    Written by the stdlib encoder when it gives the same bytes, for `tokendiff diff` leaves orjson
    unimported (~3 ms with its datetime, uuid and platform imports, against ~1 ms to encode here)."""
    if _stdlib_writes_it(doc):
        out: list[str] = []
        _indented(doc, out, "\n")
        try:
            return "".join(out).encode() + b"\n"
        except UnicodeEncodeError:
            pass  # a lone surrogate: orjson names it
    import orjson

    return orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n"


def _indented(x: Any, out: list[str], newline: str) -> None:
    """`json.dumps(x, indent=2, ensure_ascii=False)` into `out`, for the values `_stdlib_writes_it` takes, without
    importing json (its package, decoder, scanner and the encoder's patterns: ~8 M instructions of a diff): the
    same escaping (json's own C function), the same separators and layout, checked against it in
    tests/unit/test_diff_speed.py. `newline` is a line break and the indentation of x's level."""
    if isinstance(x, str):
        out.append(_quoted(x))
    elif x is None:
        out.append("null")
    elif x is True:
        out.append("true")
    elif x is False:
        out.append("false")
    elif isinstance(x, int):
        out.append(int.__repr__(x))
    elif isinstance(x, float):
        out.append(float.__repr__(x))
    elif isinstance(x, dict):
        if not x:
            out.append("{}")
            return
        inner, sep = newline + "  ", "{"
        for k, v in x.items():
            out.append(sep + inner + _quoted(k) + ": ")
            _indented(v, out, inner)
            sep = ","
        out.append(newline + "}")
    else:  # a list or tuple
        if not x:
            out.append("[]")
            return
        inner, sep = newline + "  ", "["
        for v in x:
            out.append(sep + inner)
            _indented(v, out, inner)
            sep = ","
        out.append(newline + "]")


def _stdlib_writes_it(x: Any) -> bool:
    """Whether json.dumps writes x as orjson does: plain JSON types only, integers within 64 bits and
    finite floats that repr without a negative exponent (json writes 1e-06 where orjson writes 1e-6)."""
    if isinstance(x, str) or x is None or isinstance(x, bool):
        return True
    if isinstance(x, int):
        return -(1 << 63) <= x < (1 << 64)
    if isinstance(x, float):
        return x == 0.0 or 1e-4 <= abs(x) < float("inf")
    if type(x) is dict:
        return all(type(k) is str for k in x) and all(map(_stdlib_writes_it, x.values()))
    if type(x) in (list, tuple):
        return all(map(_stdlib_writes_it, x))
    return False
