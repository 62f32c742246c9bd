"""`tokendiff diff` output: a stable JSON document and its text rendering.

The text view is rendered from the JSON document, so the two never disagree.
The schema is documented in docs/diff-json.md; bump SCHEMA on any change
that removes or renames a field.
"""

from __future__ import annotations

from typing import Any

from tokendiff.core.model import END_OF_PROMPT, Divergence, Prompt, SectionPath
from tokendiff.core.secrets import mask
from tokendiff.core.vocab import Vocab
from tokendiff.report.excerpt import excerpt

SCHEMA = "tokendiff.diff/2"


def _side(p: Prompt) -> dict[str, Any]:
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


def _finding(f: Any) -> dict[str, Any] | None:
    if f is None:
        return None
    return {
        "kind": f.kind,
        "title": f.title,
        "evidence": mask(f.evidence) if isinstance(f.evidence, str) else f.evidence,
        "fix": f.fix,
        "confidence": f.confidence,
        "expected": f.expected,
        "origin": f.origin,
    }


def path_json(path: SectionPath) -> list[dict[str, Any]]:
    """A section path as JSON: its parts, outermost first (docs/diff-json.md)."""
    return [{"kind": p.kind, "index": p.index, "name": p.name, "field": p.field} for p in path]


def _owner_at(p: Prompt, token: int) -> SectionPath:
    return p.owner(token) if token < len(p) else END_OF_PROMPT


def _text(p: Prompt, start: int, end: int, context: int) -> dict[str, Any]:
    e = excerpt(p, start, end, context)
    return {"before": e.before, "diverged": e.diverged, "after": e.after}


def _owner_fields(side: str, path: SectionPath) -> dict[str, Any]:
    return {
        f"{side}_section": path.label or "(no section)",
        f"{side}_path": path_json(path),
        f"{side}_field": path.field_path,
    }


def diff_document(
    a: Prompt, b: Prompt, d: Divergence, vocab: Vocab, context: int = 8, findings: list | None = None
) -> dict[str, Any]:
    first = None
    best = {f.hunk: f for f in (findings or [])}
    if not d.identical:
        h = d.hunks[0] if d.hunks else None
        a_end = h.a_end if h else d.lcp
        b_end = h.b_end if h else d.lcp
        first = {
            "token": d.lcp,
            "byte": a.byte_offset(d.lcp),
            "first_byte_diff": d.first_byte_diff,
            "boundary": d.boundary,
            **_owner_fields("a", _owner_at(a, d.lcp)),
            **_owner_fields("b", _owner_at(b, d.lcp)),
            "a_token_id": int(a.ids[d.lcp]) if d.lcp < len(a) else None,
            "b_token_id": int(b.ids[d.lcp]) if d.lcp < len(b) else None,
            "a_text": _text(a, d.lcp, a_end, context),
            "b_text": _text(b, d.lcp, b_end, context),
        }
    hunks = []
    for i, h in enumerate(d.hunks):
        hunks.append(
            {
                "kind": h.kind,
                "a": {
                    "tokens": [h.a_start, h.a_end],
                    "bytes": [h.a_byte_start, h.a_byte_end],
                    "section": h.a_owner.label or None,
                    "path": path_json(h.a_owner),
                    "text": _text(a, h.a_start, h.a_end, context),
                },
                "b": {
                    "tokens": [h.b_start, h.b_end],
                    "bytes": [h.b_byte_start, h.b_byte_end],
                    "section": h.b_owner.label or None,
                    "path": path_json(h.b_owner),
                    "text": _text(b, h.b_start, h.b_end, context),
                },
                "finding": _finding(best.get(i)),
            }
        )
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


def _line(style: _Style, t: dict[str, Any], side: str) -> str:
    return style.wrap(_DIM, "…" + t["before"]) + style.mark(t["diverged"], side) + style.wrap(_DIM, t["after"] + "…")


def render_text(doc: dict[str, Any], color: bool = False, max_hunks: int = 20) -> str:
    st = _Style(color)
    out: list[str] = []
    a, b = doc["a"], doc["b"]
    out.append(st.wrap(_BOLD, f"A  {a['origin']}") + f"  {a['format']}, {a['n_tokens']:,} tokens")
    out.append(st.wrap(_BOLD, f"B  {b['origin']}") + f"  {b['format']}, {b['n_tokens']:,} tokens")
    for side, d in (("A", a), ("B", b)):
        mm = d.get("render_mismatch")
        if mm:
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
    if doc["identical"]:
        out.append(f"identical: {a['n_tokens']:,} tokens, all reusable")
        return "\n".join(out) + "\n"
    pct = 100.0 * doc["reusable_fraction"]
    out.append(
        st.wrap(_BOLD, f"reusable prefix: {doc['lcp_tokens']:,} of {b['n_tokens']:,} tokens ({pct:.1f} %)")
        + f" · {doc['recompute_tokens']:,} to recompute"
    )
    f = doc["first_divergence"]
    out.append(st.wrap(_BOLD, f"first divergence: token {f['token']:,} · byte {f['byte']:,}"))
    for side in ("a", "b"):
        fld = f.get(f"{side}_field")
        extra = f"   (field {fld})" if fld else ""
        out.append(f"  {side.upper()}: {st.wrap(_CYAN, f[side + '_section'])}{extra}")
    out.append("  A │ " + _line(st, f["a_text"], "a"))
    out.append("  B │ " + _line(st, f["b_text"], "b"))
    first_finding = doc["hunks"][0].get("finding") if doc["hunks"] else None
    if first_finding:
        out.append(f"  cause: {st.wrap(_BOLD, first_finding['title'])}: {first_finding['evidence']}")
        out.append(f"  fix: {first_finding['fix']}")
    if f["boundary"]:
        fbd = f["first_byte_diff"]
        where = "the bytes are identical" if fbd is None else f"the bytes agree up to byte {fbd:,}"
        out.append(
            f"  tokenization boundary: token IDs differ at token {f['token']:,} but {where}"
            " (a BPE merge across the boundary, not a content change)"
        )
    hunks = doc["hunks"]
    out.append("")
    out.append(f"{len(hunks)} divergent span{'s' if len(hunks) != 1 else ''}:")
    for k, h in enumerate(hunks[:max_hunks], 1):
        ha, hb = h["a"], h["b"]
        out.append(
            st.wrap(_CYAN, f"@@ {k} {h['kind']}")
            + f"  A tokens {ha['tokens'][0]:,}..{ha['tokens'][1]:,} (bytes {ha['bytes'][0]:,}..{ha['bytes'][1]:,})"
            + f" → B tokens {hb['tokens'][0]:,}..{hb['tokens'][1]:,} (bytes {hb['bytes'][0]:,}..{hb['bytes'][1]:,})"
        )
        if ha["section"] == hb["section"]:
            out.append(f"   in {ha['section']}")
        else:
            out.append(f"   A in {ha['section']}")
            out.append(f"   B in {hb['section']}")
        if h.get("finding") and k > 1:
            out.append(f"   {h['finding']['title']}: {h['finding']['evidence']}")
        out.append("   - " + _line(st, ha["text"], "a"))
        out.append("   + " + _line(st, hb["text"], "b"))
    if len(hunks) > max_hunks:
        out.append(f"… {len(hunks) - max_hunks} more (--json lists all)")
    return "\n".join(out) + "\n"


def document_json(doc: dict[str, Any]) -> bytes:
    """The document as `diff --json` prints it: orjson's indented form, newline-terminated.

    Written by the stdlib encoder when it gives the same bytes, for `tokendiff diff` leaves orjson
    unimported (~3 ms with its datetime, uuid and platform imports, against ~1 ms to encode here)."""
    if _stdlib_writes_it(doc):
        import json

        try:
            return json.dumps(doc, indent=2, ensure_ascii=False).encode() + b"\n"
        except UnicodeEncodeError:
            pass  # a lone surrogate: orjson names it
    import orjson

    return orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n"


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
