"""What a capture never holds: the one secrets policy, applied to everything the proxy writes.

Three rules (docs/capture-format.md, "Secrets"):

1. **Secret-named keys** (`_SECRET_NAME`: authorization, cookie, password, secret, token, api_key,
   `*_api_key`, `*_token`, `*_secret`, credentials, private_key …; any case, `-`/`_`/camelCase alike)
   are removed, with their values, at any depth.
2. **Name/value pairs** (`[{"name": "Authorization", "value": …}]`, HAR-style header lists; also
   `key`/`header` + `value`/`val`, and `[["Authorization", …]]`) whose name is secret-named are
   removed from their list.
3. **Credential-looking values** (`_CREDENTIAL`: `Bearer …`, `sk-…`, `sk_live_…`, `ghp_…`, `AKIA…`,
   `ya29.…`, JWTs, PEM private keys …; `_KEYED`: the secret after `aws_secret_access_key=`, URL
   userinfo, Azure `AccountKey=`, `?sig=`/`?api_key=`/`?dd-api-key=` in URLs) are replaced by `[REDACTED]` inside
   any string, the substring only.

The prompt fields (`PROMPT_FIELDS`: messages, tools, system …) are what the server renders into
the prompt, so rules 1 and 2 do not apply inside them: a tool whose schema has a `password`
parameter keeps it, or the recorded tools would no longer be the ones the model saw. Rule 3
does apply there; the record's `prompt_ids` stay as the server tokenised them (they are the
truth about the cache), so a local render of a redacted request differs from them at the
redaction, and the record's `redacted` list names every field that was changed.

Core logic only: no I/O. Walks are iterative, so a body nested deeper than the recursion limit
is handled like any other.
"""

from __future__ import annotations

import re
from functools import cache, lru_cache

from tokendiff.core import jsontext
from tokendiff.core.lazyre import Lazy
from tokendiff.core.plain import plain

TYPE_CHECKING = False  # no `typing` at run time: `tokendiff diff` imports this module (core/plain.py)
if TYPE_CHECKING:
    import json
    from typing import Any

REDACTED = "[REDACTED]"

_SECRET_NAME = r"""^(?:
        (?:.*_)?(?:authorization|cookies?|set_cookie|passwords?|passwd|passphrase|secrets?|credentials?)(?:_.*)?
      | (?:.*_)?(?:auth|pwd|jwt|sessionid|session_id|sessid|csrf|xsrf)(?:_.*)?   # X-Auth, auth_header, jwt_value
      | (?:.*_)?pass                       # pass, db_pass (not bypass, pass_rate)
      | (?:.*_)?(?:api_?key|apikey|private_key|secret_key|access_key|session_key|signing_key|account_key)s?
      | (?:.*_)?token                      # token, access_token, bearer_token (not max_tokens)
      | x_api_key | x_goog_api_key
    )$"""
NAME_ENDS = 128  # characters of each end of a very long key name that decide whether it names a secret
# tokenizer settings, not credentials (they may appear in chat_template_kwargs or metadata)
NOT_SECRET = frozenset({"bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token"})

# a credential starts a word: not inside an identifier (`my-sk-…`), but after a lone hyphen it does
# (`${KEY:-sk-…}`, a tool-set change `-sk_live_…`)
_CREDENTIAL = r"""(?<![A-Za-z0-9_])(?<![A-Za-z0-9_]-)(?:
        (?:Bearer|bearer|BEARER|Basic|basic)\s{1,8}(?=[A-Za-z._~+/=-]{0,256}[0-9+/=])[A-Za-z0-9._~+/=-]{8,}
      | sk-(?=[A-Za-z0-9_-]{0,256}[0-9])[A-Za-z0-9_-]{16,}  # OpenAI sk-, sk-proj-; Anthropic sk-ant-
      | (?:sk|rk)_(?:live|test)_[A-Za-z0-9]{10,}          # Stripe secret and restricted keys
      | (?:gh[pousr]_|github_pat_)[A-Za-z0-9_]{20,}       # GitHub
      | glpat-[A-Za-z0-9_-]{20,}                          # GitLab
      | (?:xox[abposr]|xapp)-[A-Za-z0-9-]{10,}            # Slack
      | AIza[0-9A-Za-z_-]{35}                             # Google API keys
      | ya29\.[0-9A-Za-z_-]{20,}                          # Google OAuth access tokens
      | (?:AKIA|ASIA)[0-9A-Z]{16}                         # AWS access key ids
      | hf_[A-Za-z0-9]{30,}                               # Hugging Face
      | eyJ[A-Za-z0-9_-]{4,8192}\.eyJ[A-Za-z0-9_-]{4,65536}\.[A-Za-z0-9_-]{4,}  # JWTs
      | -----BEGIN[A-Z ]*PRIVATE\ KEY-----[\s\S]*?(?:-----END[A-Z ]*PRIVATE\ KEY-----|$)
    )"""
# credentials known by what stands before them: only the `secret` group is replaced, so the text says
# what was there (`aws_secret_access_key = [REDACTED]`, `https://[REDACTED]@host`)
_KEYED = (
    r"(?i:aws_?secret_?access_?key|aws_?secret_?key|secret_?access_?key)\\?[\"']?\s*[:=]\s*\\?[\"']?"
    r"(?P<secret>[A-Za-z0-9/+=]{40})(?![A-Za-z0-9/+=])",  # AWS secret access keys
    # URL userinfo (a scheme of at most 32 characters: every bound here keeps a search linear in the text)
    r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]{0,31}://(?P<secret>[^\s/?#@:\"'<>\\]{1,256}:[^\s/?#@\"'<>\\]{1,1024})@",
    r"(?:AccountKey|SharedAccessKey)=(?P<secret>[A-Za-z0-9+/]{20,}={0,2})",  # Azure connection strings
    # in URLs, also after a vendor's or a role's words (Datadog's `dd-api-key=`, `x-api-key=`, `client_secret=`)
    r"[?&](?i:(?:[a-z0-9]{1,32}[-_]){0,4}(?:sig|api[-_]?key|access[-_]?token|token|password|secret|key))"
    r"=(?P<secret>[^&\s\"'#<>\\]{8,})",
)


@cache
def _patterns(kind: type) -> tuple[re.Pattern[Any], re.Pattern[Any], tuple[re.Pattern[Any], ...]]:
    """(secret names, credentials, keyed credentials) compiled for str or bytes, once, when first
    needed: `tokendiff diff` masks its excerpts (bytes) and never pays for the rest."""

    def enc(p: str) -> Any:
        return p if kind is str else p.encode()

    return (
        re.compile(enc(_SECRET_NAME), re.VERBOSE),
        re.compile(enc(_CREDENTIAL), re.VERBOSE),
        tuple(re.compile(enc(p)) for p in _KEYED),
    )


# cheap test on raw bytes first (substring search, no regex): most bodies hold no credential shape
_CREDENTIAL_HINTS = (
    *(b"earer", b"EARER", b"asic", b"ASIC", b"sk-", b"github_pat_", b"AKIA", b"ASIA", b"eyJ", b"xox"),
    *(b"AIza", b"hf_", b"glpat-", b"PRIVATE KEY", b"ghp_", b"gho_", b"ghu_", b"ghs_", b"ghr_"),
    *(b"_live_", b"_test_", b"ya29.", b"xapp-", b"ecret", b"ECRET", b"://", b"ccountKey", b"ccessKey"),
)

_ASCII_ESCAPE = Lazy(rb"\\u00[2-7][0-9a-fA-F]")  # escapes that could spell a hint (printable ASCII)

# request fields the server renders into the prompt (OpenAI chat/completions/responses, Anthropic)
PROMPT_FIELDS = frozenset(
    {"messages", "tools", "functions", "system", "prompt", "input", "instructions", "chat_template_kwargs"}
)
_PAIR_NAMES = ("name", "key", "header")
_PAIR_VALUES = ("value", "val", "values")

Path = tuple[str | int, ...]


@plain(frozen=True)
class Edit:
    """One change the policy makes: remove the member/element at `path`, or replace its string."""

    path: Path
    new: str | None  # None: removed


Targets = dict[Path, Edit]  # the edits by the path they change
Cuts = list[tuple[int, int, str]]  # (start, end, replacement) in the text


def is_secret_name(name: str) -> bool:
    """Whether a key (or a header name) names a credential."""
    if len(name) > 2 * NAME_ENDS + 1:  # a name this long is judged by its ends (`authorization_…`, `…_token`)
        name = name[:NAME_ENDS] + "_" + name[-NAME_ENDS:]
    return _judged(name)


@lru_cache(maxsize=4096)  # a body's keys are mostly the same few dozen names, request after request
def _judged(name: str) -> bool:
    norm = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower().replace("-", "_").replace(" ", "_")
    return norm not in NOT_SECRET and _patterns(str)[0].match(norm) is not None


# what every match of _CREDENTIAL or _KEYED holds, lowercased: text without any of them matches neither, and
# needs no regex (nor their compiling: `tokendiff diff` masks a few excerpts)
_MATCH_NEEDS = (
    *("bearer", "basic", "sk-", "_live_", "_test_", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    *("glpat-", "xox", "xapp-", "aiza", "ya29.", "akia", "asia", "hf_", "eyj", "-----begin"),
    *("secret", "://", "key=", "sig=", "token=", "password="),
)
_MATCH_NEEDS_BYTES = tuple(h.encode() for h in _MATCH_NEEDS)


def _may_match(text: str | bytes) -> bool:
    """False only when no credential pattern can match `text`: its ASCII letters lowered, it holds none of
    _MATCH_NEEDS. Text with other characters is always searched (Unicode case folding: `ſ` matches `s`)."""
    if isinstance(text, bytes):  # bytes patterns match ASCII case-insensitively only
        return _holds_a_need(text.lower(), bytes)
    return not text.isascii() or _holds_a_need(text.lower(), str)


_BY_IN = 64  # texts of a kind searched literal by literal before `_needs` compiles its pattern (~0.2 ms a kind)
_searched: dict[type, int] = {str: 0, bytes: 0}


def _holds_a_need(low: str | bytes, kind: type) -> bool:
    """Whether `low` holds any of _MATCH_NEEDS: by `in`, one literal at a time, for a command's first few texts
    (a diff masks a handful), then by the one-pass pattern; either finds a literal where the other does."""
    if _searched[kind] < _BY_IN:
        _searched[kind] += 1
        needs: tuple[Any, ...] = _MATCH_NEEDS_BYTES if kind is bytes else _MATCH_NEEDS
        return any(h in low for h in needs)
    return _needs(kind).search(low) is not None


@cache
def _needs(kind: type) -> re.Pattern[Any]:
    """Any of _MATCH_NEEDS, found in one pass (a report masks every excerpt it shows: thousands of texts,
    each searched for ~30 literals one `in` at a time before); compiled when first asked for."""
    if kind is bytes:
        return re.compile(b"|".join(re.escape(h) for h in _MATCH_NEEDS_BYTES))
    return re.compile("|".join(re.escape(h) for h in _MATCH_NEEDS))


def mask(text: str) -> str:
    """`text` with every credential-looking substring replaced by `[REDACTED]`. A short text's answer is kept
    (a function of the text alone): a report's findings repeat a few titles, fixes and evidence sentences turn
    after turn, and masking one that holds a pattern's literals runs every pattern (~60 k instructions)."""
    if len(text) > _MEMO_CHARS:
        return _masked(text)
    got = _MEMO.get(text)
    if got is None:
        if len(_MEMO) >= 4096:
            _MEMO.clear()
        got = _MEMO[text] = _masked(text)
    return got


_MEMO_CHARS = 512
_MEMO: dict[str, str] = {}


def _masked(text: str) -> str:
    if not _may_match(text):
        return text
    _, credential, keyed = _patterns(str)
    text = credential.sub(REDACTED, text)
    for pattern in keyed:
        text = pattern.sub(_keep_around, text)
    return text


def _keep_around(m: re.Match[str]) -> str:
    whole, at = m.group(0), m.start()
    return whole[: m.start("secret") - at] + REDACTED + whole[m.end("secret") - at :]


def credential_spans(data: bytes) -> list[tuple[int, int]]:
    """The byte ranges of `data` that `mask` would replace, in order, merged (for a report that shows
    pieces of a prompt: a credential cut across two pieces is still found whole)."""
    if not _may_match(data):
        return []
    _, credential, keyed = _patterns(bytes)
    spans = [m.span() for m in credential.finditer(data)]
    spans += [m.span("secret") for p in keyed for m in p.finditer(data)]
    merged: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
        else:
            merged.append((a, b))
    return merged


def may_hold_credentials(raw: bytes) -> bool:
    """False when no value in `raw` can match CREDENTIAL (a fast pre-check on the body bytes). A JSON
    escape of a printable ASCII character (`\\u0073k-`, `https:\\/\\/`) can hide a hint from the bytes
    while the parsed text holds it whole: such a body is always read."""
    if any(h in raw for h in _CREDENTIAL_HINTS):
        return True
    return b"\\" in raw and (b"\\/" in raw or _ASCII_ESCAPE.search(raw) is not None)


def plan(value: Any, *, prompt_fields: bool = True, values: bool = True) -> list[Edit]:
    """The edits the policy makes to a JSON value, in document order. With `prompt_fields`,
    the top-level PROMPT_FIELDS get rule 3 only; `values=False` skips rule 3 (no credential shapes).
    Paths are kept as links to their parent's until an edit needs one, so depth costs no copies."""
    edits: list[Edit] = []
    stack: list[tuple[_Link, Any, bool]] = [(None, value, False)]
    while stack:
        link, v, in_prompt = stack.pop()
        if isinstance(v, str):
            if values:
                new = mask(v)
                if new != v:
                    edits.append(Edit(_path(link), new))
        elif isinstance(v, dict):
            for k in reversed(list(v)):
                if not in_prompt and isinstance(k, str) and is_secret_name(k):
                    edits.append(Edit(_path((link, k)), None))
                else:
                    prompt = in_prompt or (prompt_fields and link is None and k in PROMPT_FIELDS)
                    if values or not prompt:  # without rule 3 nothing inside a prompt field can change
                        stack.append(((link, k), v[k], prompt))
        elif isinstance(v, list):
            for i in reversed(range(len(v))):
                if not in_prompt and _secret_pair(v[i]):
                    edits.append(Edit(_path((link, i)), None))
                else:
                    stack.append(((link, i), v[i], in_prompt))
    edits.sort(key=_order)
    return edits


if TYPE_CHECKING:
    _Link = tuple[Any, str | int] | None  # (parent's link, step); None: the root


def _path(link: _Link) -> Path:
    steps: list[str | int] = []
    while link is not None:
        link, step = link
        steps.append(step)
    return tuple(reversed(steps))


def _order(e: Edit) -> tuple[tuple[int, Any], ...]:
    """Document order; keys and indices never meet at one depth of one container, so tag them."""
    return tuple((0, s) if isinstance(s, int) else (1, s) for s in e.path)


def _secret_pair(item: Any) -> bool:
    """A header-like entry naming a credential: {"name": "Authorization", "value": v} (also `key`/`header`
    with `value`/`val`), or ["Authorization", v]."""
    if isinstance(item, list):
        return len(item) == 2 and isinstance(item[0], str) and is_secret_name(item[0])
    if not isinstance(item, dict) or not any(v in item for v in _PAIR_VALUES):
        return False
    return any(isinstance(item.get(n), str) and is_secret_name(item[n]) for n in _PAIR_NAMES)


def apply(value: Any, edits: list[Edit]) -> Any:
    """A copy of `value` with `edits` made; untouched subtrees are shared, not copied."""
    if not edits:
        return value
    root = _copy(value)
    copied = {id(root)}
    # last first: a removal from a list never shifts an index another edit still needs
    for e in sorted(edits, key=_order, reverse=True):
        parent = root
        for step in e.path[:-1]:
            child = parent[step]
            if id(child) not in copied:
                child = _copy(child)
                parent[step] = child
                copied.add(id(child))
            parent = child
        last = e.path[-1] if e.path else None
        if last is None:
            return e.new
        if e.new is None:
            del parent[last]
        else:
            parent[last] = e.new
    return root


def _copy(v: Any) -> Any:
    return dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v


MAX_PATH_STEPS = 32  # a deeper path is written as its first steps and its depth


def path_text(path: Path) -> str:
    """`metadata.headers[0]`: how a path is written in a record's `redacted` list (a path 100,000 levels
    deep as its first steps and `…(100000 levels)`)."""
    out = ""
    for step in path[:MAX_PATH_STEPS]:
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else str(step))
    return out if len(path) <= MAX_PATH_STEPS else f"{out}…({len(path)} levels)"


# ---------------------------------------------------------------- verbatim bodies


@cache
def _decoder() -> json.JSONDecoder:
    """json's decoder, made where a verbatim body is first edited (`tokendiff diff` never imports json)."""
    import json

    return json.JSONDecoder()


_WS = Lazy(r"[ \t\n\r]*")  # compiled where a verbatim body is first edited


def apply_text(text: str, edits: list[Edit]) -> str:
    """`text` (a JSON document kept byte for byte) with `edits` made in place: every other byte
    stays as it was. A removed member's value becomes `"[REDACTED]"` here (cutting members out of
    raw text would have to re-punctuate it); a replaced string is re-encoded by json."""
    if not edits:
        return text
    targets = {e.path: e for e in edits}
    cuts: Cuts = []
    try:
        prefixes = {e.path[:i] for e in edits for i in range(len(e.path))} if _shallow(edits) else None
        if prefixes is None:
            raise RecursionError
        _walk_text(text, _skip(text, 0), (), targets, prefixes, cuts)
    except RecursionError:  # nested deeper than the recursion limit: the iterative walk, slower
        cuts = [(a, b, _replacement(targets[p])) for p, (a, b) in jsontext.value_spans(text, targets).items()]
    out, pos = [], 0
    for a, b, rep in sorted(cuts):
        out += [text[pos:a], rep]
        pos = b
    out.append(text[pos:])
    return "".join(out)


def _skip(text: str, i: int) -> int:
    m = _WS.match(text, i)
    return m.end() if m else i


def _walk_text(text: str, i: int, path: Path, targets: Targets, prefixes: set[Path], cuts: Cuts) -> int:
    """The end of the JSON value at `i`, recording the cuts for `targets` inside it."""
    if path not in prefixes or text[i] not in "{[":
        end = _decoder().raw_decode(text, i)[1]
    else:
        end = _walk_container(text, i, path, targets, prefixes, cuts)
    edit = targets.get(path)
    if edit is not None:
        cuts.append((i, end, _replacement(edit)))
    return end


def _replacement(edit: Edit) -> str:
    import json

    return json.dumps(REDACTED if edit.new is None else edit.new)


def _shallow(edits: list[Edit]) -> bool:
    """Whether every edit is shallow enough for the recursive walk (its prefixes are cheap, too)."""
    return all(len(e.path) < 200 for e in edits)


def _walk_container(text: str, i: int, path: Path, targets: Targets, prefixes: set[Path], cuts: Cuts) -> int:
    is_obj = text[i] == "{"
    j = _skip(text, i + 1)
    if text[j] in "}]":
        return j + 1
    n = 0
    while True:
        step: str | int = n
        if is_obj:
            step, j = jsontext.scanstring(text, j + 1)
            j = _skip(text, _skip(text, j) + 1)  # past the colon
        j = _skip(text, _walk_text(text, j, (*path, step), targets, prefixes, cuts))
        n += 1
        if text[j] != ",":
            return j + 1
        j = _skip(text, j + 1)
