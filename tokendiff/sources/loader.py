"""Turn a user's selector into a decoded, sectioned Prompt.

Selectors: a slot file; `DIR@N` (the N-th turn of a directory of slot files,
request bodies or llama-server prompt logs); `capture.jsonl@N`; `session.har@N`; `traces.json@N` (an
OpenTelemetry trace export's N-th LLM span);
a request body `.json`; a prompt log `.txt`. N counts from 1; negative N
counts from the end.

This is the I/O edge for prompts: it reads files, checks IDs against the
tokenizer, decodes them to exact bytes, renders requests through the chat
template and attributes sections.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokendiff import safeio
from tokendiff.core import grammar
from tokendiff.core.kinds import Sectioning, ServerKind
from tokendiff.core.model import LOCAL_RENDER_IDS, Prompt, PromptMeta, RenderMismatch
from tokendiff.core.plain import plain, replace
from tokendiff.core.vocab import SPECIAL, TextTokenizer, Vocab
from tokendiff.errors import InputError, one_line
from tokendiff.notices import warn
from tokendiff.sources.importers import check_depth
from tokendiff.sources.slotfile import (
    SlotFile,
    check_vocab,
    is_slot_file,
    list_session_dir,
    natural_key,
    read_slot_file,
)

TYPE_CHECKING = False  # no `typing` at run time: `tokendiff diff` imports this module (core/plain.py)
if TYPE_CHECKING:  # numpy is imported where it is used: `tokendiff diff` of slot files never needs it
    from typing import Any, Protocol, TypeVar

    import numpy as np

    from tokendiff.core.model import IntArray, Rendered
    from tokendiff.core.tails import Decoded
    from tokendiff.sources.importers.responses import FieldMap
    from tokendiff.sources.record import CaptureRecord
    from tokendiff.sources.templates.render import Renderer

    T = TypeVar("T")

    class PromptServer(Protocol):
        """A live server that renders requests and tokenises text for the loader, in its own vocabulary
        (tokendiff.backends.tokenizer.ServerPrompts is the llama-server one; the application layer passes it)."""

        url: str

        def tokenize(self, text: str, add_special: bool = False) -> list[int]: ...

        def prompt_ids(self, request: dict[str, Any]) -> list[int]: ...


MAX_PROPS_BYTES = 64 << 20  # the server's /props beside a capture: its chat template and settings
_SELECTOR = re.compile(r"^(?P<base>.+)@(?P<n>-?\d+)$")


@plain(frozen=True)
class Selected:
    kind: str  # slot | capture | har | otlp | body | promptlog
    path: Path
    label: str  # how reports name it (one line of valid text), e.g. "captures/demo@3 (turn-03.bin)"
    turn: int | None  # 1-based position within a session, when chosen from one


def _pick(items: Sequence[T], n: int, what: str, source: str) -> tuple[int, T]:
    idx = n - 1 if n > 0 else len(items) + n
    if n == 0 or not 0 <= idx < len(items):
        rng = f"1..{len(items)}" if items else "none"
        raise InputError(f"{what} {n} is out of range: there are {len(items)} ({rng})", source=source)
    return idx, items[idx]


SESSION_FILES = ("capture", "har", "otlp")  # file kinds that hold many turns (`file@N` picks one)
CAPTURE_NAME = "capture.jsonl"  # what `proxy` and `watch` write in their --out directory


def session_source(path: str) -> str:
    """The file or directory that holds a session's turns: a recording directory (`proxy --out DIR`)
    is its capture.jsonl, unless slot files of its own sit beside it."""
    p = Path(path)
    if safeio.is_dir(p) and safeio.is_file(p / CAPTURE_NAME) and not list_session_dir(p):
        return str(p / CAPTURE_NAME)  # its reader says what is wrong with it, if anything is
    return path


def _dir_entries(base: Path, order: str) -> tuple[str, list[Path]]:
    slots = list_session_dir(base, order)
    if slots:
        return "slot", slots
    files = sorted(
        (base / n for n in safeio.list_dir(base) if safeio.is_file(base / n)), key=lambda e: natural_key(e.name)
    )
    if order == "mtime":  # asked for: request bodies and prompt logs are ordered by name otherwise
        files.sort(key=lambda e: e.stat().st_mtime_ns)
    bodies = [
        e
        for e in files
        if e.suffix == ".json" and e.name not in ("session.json", "props.json", "models.json", "slots.json")
    ]
    if bodies:
        return "body", bodies
    logs = [e for e in files if e.suffix == ".txt"]
    if logs:
        return "promptlog", logs
    raise InputError("no slot files, request bodies (.json) or prompt logs (.txt) in this directory", source=str(base))


def file_kind(p: Path) -> str:
    """What a file holds (slot | capture | har | otlp | promptlog | body), from its magic, name and first bytes."""
    if is_slot_file(p):
        return "slot"
    from tokendiff.sources.capture import is_capture_file

    if is_capture_file(p):
        return "capture"
    suffix = p.suffix.lower()
    _refuse_gzip(p, suffix)
    if suffix == ".har":
        return "har"
    if suffix == ".txt":
        return "promptlog"
    if suffix in (".json", ".jsonl", ".gz") or p.suffix == "":
        raw = safeio.head(p, 4096)
        head = raw.removeprefix(b"\xef\xbb\xbf").lstrip()
        if head.startswith(b"{") and b'"log"' in head[:200] and b'"entries"' in head:
            return "har"
        from tokendiff.sources.importers.otlp import is_otlp_head

        if is_otlp_head(head):
            return "otlp"
        if head.startswith(b"{") and suffix != ".jsonl":
            return "body"
        if suffix == ".jsonl" and p.name == CAPTURE_NAME and not head:
            return "capture"  # a recording that has recorded nothing yet
        if suffix == ".jsonl":
            raise InputError(f"not a tokendiff capture: {_first_line_is(head, raw)}", source=str(p))
        if suffix == ".json":
            raise InputError(f"not a request body or HAR file: {_first_line_is(head, raw)}", source=str(p))
    _refuse_otlp_protobuf(p)
    return "slot"  # let the slot reader say what is wrong with it


def _refuse_otlp_protobuf(p: Path) -> None:
    """An OTLP/protobuf export is an error naming what it is (it was called a slot file)."""
    from tokendiff.sources.importers.otlp import is_otlp_protobuf_head

    if is_otlp_protobuf_head(safeio.head(p, 16)):
        raise InputError(
            "an OTLP/protobuf trace export: tokendiff reads OTLP/JSON (the Collector's file exporter with "
            "format: json, or a /v1/traces body sent as JSON)",
            source=str(p),
        )


def _refuse_gzip(p: Path, suffix: str) -> None:
    """A gzip-compressed prompt file said to be one (the slot reader would say 'magic 0x08088b1f')."""
    if suffix == ".gz" and safeio.head(p, 2) == b"\x1f\x8b":
        raise InputError("a gzip-compressed file: prompts are read uncompressed (gunzip it first)", source=str(p))


def _first_line_is(head: bytes, raw: bytes) -> str:
    """What a JSON file that is none of ours starts with (`head`: its first bytes without a BOM and
    leading whitespace), for its error."""
    if not raw:
        return "the file is empty"
    if not head:
        return "it holds only white space"
    if head.startswith(b"{"):
        return "its first line is not a tokendiff.capture record"
    return "it does not start with a JSON object"


def selector_base(spec: str) -> str:
    """The file or directory a selector reads: `base` of `base@N`, else the selector itself (a session path as
    given, `user@host/session` included, or a file whose own name ends in `@N`)."""
    m = _SELECTOR.match(spec)
    return m.group("base") if m and not safeio.exists(spec) else spec


def select(spec: str, order: str = "auto") -> Selected:
    m = _SELECTOR.match(spec)
    if m and not safeio.exists(spec):
        base, n = Path(session_source(m.group("base"))), int(m.group("n"))
        if not safeio.exists(base):
            raise InputError("no such file or directory", source=str(base))
        if safeio.is_dir(base):
            kind, files = _dir_entries(base, order)
            idx, f = _pick(files, n, "turn", str(base))
            kind = kind if kind == "slot" else file_kind(f)  # as `session_turns` reads it
            if kind in SESSION_FILES:
                raise _many_requests(kind, f)
            return Selected(kind, f, one_line(f"{base}@{idx + 1} ({f.name})"), idx + 1)
        safeio.require_regular(base)
        kind = file_kind(base)
        if kind in SESSION_FILES:
            return Selected(kind, base, one_line(f"{base}@{n}"), n)
        raise InputError(
            f"'@{n}' selects a turn of a session (directory, capture, HAR or OTLP file), and this is a {kind} file",
            source=str(base),
        )
    p = Path(spec)
    if safeio.is_dir(p):
        raise InputError("is a directory: pick a turn with DIR@N (counting from 1)", source=spec)
    if not safeio.exists(p):
        raise InputError("no such file", source=spec)
    safeio.require_regular(p)
    kind = file_kind(p)
    if kind in SESSION_FILES:
        raise InputError(f"a {kind} file holds many requests: pick one with {spec}@N (counting from 1)", source=spec)
    return Selected(kind, p, one_line(spec), None)


HELD_HAR_BYTES = 64 << 20  # a HAR up to this size is parsed once and its requests held; a larger one is streamed


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0  # its reader says what is wrong


def _har_request(path: Path, n: int) -> CaptureRecord:
    """A HAR file's `n`-th request (from the end where negative), read as a stream up to it: a HAR may be GBs
    and its requests parsed several times that (every one held, a 320 MB HAR took 1.1 GB to diff two)."""
    from itertools import islice

    from tokendiff.sources.importers.har import iter_har

    k = n
    if n < 0:  # counted first: a second pass picks it
        k = sum(1 for _ in iter_har(path)) + n + 1
    rec = next(islice(iter_har(path, warn), k - 1, None), None) if k > 0 else None
    if rec is None:
        _pick(range(sum(1 for _ in iter_har(path))), n, "request", str(path))  # raises: out of range
    assert rec is not None
    return rec


def _many_requests(kind: str, path: Path) -> InputError:
    """A capture, HAR or OTLP file among a directory's request bodies: no one turn of it is the directory's."""
    what = {"capture": "a capture", "har": "a HAR file", "otlp": "an OTLP trace export"}.get(kind, kind)
    return InputError(
        f"{what} holds many requests, not one turn among the directory's request bodies: "
        f"read it on its own ({one_line(str(path))}@N)",
        source=str(path),
    )


def session_selectors(path: str, order: str = "auto") -> list[str]:
    """One selector per turn of a session: a directory, a capture file, a HAR file or an OTLP trace export."""
    path = session_source(path)
    p = Path(path)
    if not safeio.exists(p):
        if selector_base(path) != path and safeio.exists(selector_base(path)):  # `capture.jsonl@3`: it exists
            raise InputError("'@N' picks one turn, and a session is read whole: name it without '@N'", source=path)
        raise InputError("no such file or directory", source=path)
    if safeio.is_dir(p):
        _, files = _dir_entries(p, order)
        return [str(f) for f in files]
    safeio.require_regular(p)
    kind = file_kind(p)
    if kind == "capture":
        from tokendiff.sources.capture import read_capture

        n = len(read_capture(p)[0])
    elif kind == "har":
        from tokendiff.sources.importers.har import iter_har

        n = sum(1 for _ in iter_har(p))
    elif kind == "otlp":
        from tokendiff.sources.importers.otlp import iter_otlp

        n = sum(1 for _ in iter_otlp(p))
    else:
        raise InputError(
            f"a session is a directory, a capture file, a HAR file or an OTLP trace export; this is a {kind} file",
            source=path,
        )
    if n == 0:
        raise InputError("the session holds no chat requests", source=path)
    return [f"{path}@{i}" for i in range(1, n + 1)]


def session_turns(path: str, order: str = "auto") -> list[Selected]:
    """Every turn of a session directory from one listing, as `select` picks each file
    (selecting `DIR@N` turn by turn lists and sorts the directory every time)."""
    base = Path(path)
    kind, files = _dir_entries(base, order)
    return [Selected(kind if kind == "slot" else file_kind(f), f, one_line(str(f)), None) for f in files]


class Loader:
    """Loads prompts with one tokenizer, template family and chat template.

    The full text tokenizer and the chat-template renderer are created only
    when a selector needs them (requests and prompt logs), so `diff` of slot
    files never imports tokenizers, transformers or jinja.
    """

    def __init__(
        self,
        vocab: Vocab,
        family: str | None = None,
        order: str = "auto",
        chat_template: str | None = None,
        server: PromptServer | None = None,
        template_name: str | None = None,
    ):
        self.vocab = vocab
        self.family = family
        self._families: dict[tuple[int, ...], str | None] = {}  # `_family_of` by the special IDs present
        self.order = order
        self.chat_template = chat_template
        self.template_name = template_name  # where chat_template came from, for its errors
        self._given_template = chat_template  # the one the user named: a session may adopt its server's
        self.server = server  # a live server renders and tokenises requests (the vocabulary is its own)
        self._tokenizer: TextTokenizer | None = None
        self._renderer: Renderer | None = None
        self._sessions: dict[Path, list[CaptureRecord]] = {}
        self._capture_templates: dict[Path, str] = {}  # the chat template of each capture's saved /props
        self._template_loaders: dict[str, Loader] = {}  # `_capture_loader`'s, by template
        self._last_read: tuple[np.ndarray, bytes, np.ndarray] | None = None  # `sectioning`'s last prompt
        self._flags: np.ndarray | None = None  # SPECIAL of every token, for `_read_next`

    def with_template(self, chat_template: str | None) -> Loader:
        """This loader with another chat template, sharing its text tokenizer (built once: parsing
        a tokenizer.json costs a second), and itself when the template is the same."""
        if chat_template == self.chat_template:
            return self
        other = Loader(self.vocab, self.family, self.order, chat_template, self.server, "a capture's props.json")
        other._tokenizer = self._tokenizer
        return other

    def fresh(self) -> Loader:
        """This loader as a new session finds it: its vocabulary and text tokenizer shared, no chat template
        adopted from a session it read (a fleet reads many with one loader's tables)."""
        other = Loader(self.vocab, self.family, self.order, self._given_template, self.server)
        other._tokenizer = self._tokenizer
        return other

    def warm_text(self) -> None:
        """Build the text tokenizer and compile the chat template now, where the session will render
        requests locally: worker processes forked after this inherit both instead of each building them."""
        if self.server is not None or not self._can_render():
            return
        try:
            _ = self.tokenizer, self.renderer.typed_content  # the probe render compiles the template
        except InputError:
            pass  # the loads that need them raise it, with their source

    # ---------------------------------------------------------------- slots

    def load(self, spec: str, like: Prompt | None = None) -> Prompt:
        """The prompt `spec` selects; a slot file's decoded after `like` (copying what it shares with it), where
        it is the other prompt of a pair."""
        return self.load_selected(select(spec, self.order), like=like)

    def load_selected(
        self, sel: Selected, slot: SlotFile | None = None, like: Prompt | None = None, decoded: Decoded | None = None
    ) -> Prompt:
        """`load` for a turn selected already; from `slot` when its file was read (and warned about) already, and a
        slot file's from `decoded`, its tokens' `vocab.decode`, where that was made already."""
        if sel.kind == "slot":
            return self._slot(sel, slot, like, decoded)
        rec = self._record(sel)
        return self._capture_loader(sel).from_record(rec, sel.label, sel.turn)

    def _capture_loader(self, sel: Selected) -> Loader:
        """The loader that renders a capture's records: with the chat template of the server's /props saved beside
        it, unless the user named one (this loader, that adopted the first capture's, rendered a second capture
        recorded from another server with the first one's template: two prompts that differ were "identical")."""
        tmpl = self._capture_templates.get(sel.path) if sel.kind == "capture" and not self._given_template else None
        if tmpl is None or tmpl == self.chat_template:
            return self
        if tmpl not in self._template_loaders:
            self._template_loaders[tmpl] = self.with_template(tmpl)
            self._template_loaders[tmpl].template_name = str(sel.path.parent / "props.json")
        return self._template_loaders[tmpl]

    def _slot(
        self, sel: Selected, slot: SlotFile | None = None, like: Prompt | None = None, decoded: Decoded | None = None
    ) -> Prompt:
        if slot is None:
            slot = read_slot_file(sel.path)
            for w in slot.warnings:
                warn(w)
        meta = PromptMeta(
            path=one_line(str(sel.path)),
            format=f"{slot.kind} v{slot.version}" + (" packed" if slot.packed else ""),
            state_bytes=slot.state_bytes,
            media_chunks=slot.media_chunks,
            turn=sel.turn,
            arch=slot.arch or None,
        )
        p = self._decode(slot.tokens, str(sel.path), sel.label, meta, like, decoded)
        fam = grammar.annotate(p, self.family)
        _check_tokenizer_fits(p, fam, self.family, self)
        return p

    def _decode(
        self,
        ids: IntArray,
        source: str,
        label: str,
        meta: PromptMeta,
        like: Prompt | None = None,
        decoded: Decoded | None = None,
    ) -> Prompt:
        if not _ids_below(ids, self.vocab.n_vocab):
            check_vocab(ids, self.vocab.n_vocab, source, self.vocab.name)
        if decoded is None:
            before = (like.ids, like.data, like.offsets, like.special) if like is not None else None
            decoded = self.vocab.decode(ids, before)
        data, offsets, special = decoded
        return Prompt(ids=ids, data=data, offsets=offsets, special=special, origin=label, meta=meta)

    # ---------------------------------------------------------------- requests

    def _record(self, sel: Selected) -> CaptureRecord:
        if sel.kind == "body":
            from tokendiff.sources.importers.openai_body import record_from_body

            return record_from_body(sel.path)
        if sel.kind == "promptlog":
            from tokendiff.sources.importers.llama_logs import record_from_prompt_log

            return record_from_prompt_log(sel.path)
        if sel.turn is None:  # listed among a directory's request bodies (`session_turns`)
            raise _many_requests(sel.kind, sel.path)
        if sel.kind == "har" and sel.path not in self._sessions and _file_size(sel.path) > HELD_HAR_BYTES:
            return _har_request(sel.path, sel.turn)
        records = self._session(sel)
        idx, rec = _pick(records, sel.turn or 0, "request", str(sel.path))
        return rec

    def _session(self, sel: Selected) -> list[CaptureRecord]:
        if sel.path not in self._sessions:
            if sel.kind == "capture":
                from tokendiff.sources.capture import read_capture

                records, warnings = read_capture(sel.path)
                for w in warnings:
                    warn(w)
                props = sel.path.parent / "props.json"
                tmpl = _props_template(props)  # read once: this capture's, and the loader's if it has none
                if tmpl is not None:
                    self._capture_templates[sel.path] = tmpl
                self._adopt_server_template(tmpl, props)
            elif sel.kind == "otlp":
                from tokendiff.sources.importers.otlp import read_otlp

                records = read_otlp(sel.path, warn)
            else:
                from tokendiff.sources.importers.har import read_har

                records = read_har(sel.path, warn)
            self._sessions[sel.path] = records
        return self._sessions[sel.path]

    def adopt_capture_template(self, capture: Path) -> None:
        """For a capture read record by record (the application's streaming session): the template from
        the server's /props saved beside it, as loading `capture@N` does."""
        props = Path(capture).parent / "props.json"
        self._adopt_server_template(_props_template(props), props)

    def _adopt_server_template(self, tmpl: str | None, props_path: Path) -> None:
        """The proxy saves the server's /props beside a capture: its chat template (`tmpl`, read from
        `props_path`) is the one the server rendered with, unless the user named one."""
        if tmpl is not None and not self.chat_template and self._renderer is None:
            self.chat_template, self.template_name = tmpl, str(props_path)

    @property
    def tokenizer(self) -> TextTokenizer:
        if self._tokenizer is None:
            from tokendiff.sources.tokenizers import text_tokenizer

            server = self.server
            self._tokenizer = (
                TextTokenizer(server.tokenize, server.url) if server is not None else text_tokenizer(self.vocab)
            )
        return self._tokenizer

    @property
    def renderer(self) -> Renderer:
        if self._renderer is None:
            from tokendiff.sources.templates.render import Renderer

            tmpl = self.chat_template or self.vocab.meta.chat_template
            if not tmpl:
                raise InputError(
                    f"no chat template: {self.vocab.name} carries none; pass --chat-template FILE, "
                    "a tokenizer directory with tokenizer_config.json, a GGUF file, or --server URL"
                )
            m = self.vocab.meta
            bos, eos = self._special_text(m.bos_token, m.bos_id), self._special_text(m.eos_token, m.eos_id)
            name = (self.template_name or "the chat template given") if self.chat_template else self.vocab.name
            self._renderer = Renderer(tmpl, bos_token=bos, eos_token=eos, name=name)
        return self._renderer

    def _special_text(self, text: str | None, token_id: int | None) -> str:
        if text is not None:
            return text
        if token_id is not None and 0 <= token_id < self.vocab.n_vocab:
            return self.vocab.piece(token_id).decode("utf-8", "replace")
        return ""

    def from_record(
        self,
        rec: CaptureRecord,
        label: str,
        turn: int | None = None,
        rendered_ids: np.ndarray | None = None,
        depth_checked: bool = False,
    ) -> Prompt:
        """A prompt from a capture record: the server's IDs when recorded, else the local render (or
        the logged text) tokenised. `rendered_ids`: what `rendered_ids` gave for this record, so its
        render is not tokenised again; `depth_checked`: its request's nesting was checked when it was
        read (a HAR's is), so it is not walked again."""
        from tokendiff.sources.templates.env import rendered_at

        try:
            with rendered_at(_sent_at(rec), _to_llama_server(rec)):
                return self._from_record(rec, label, turn, rendered_ids, depth_checked)
        except InputError as e:
            if e.source:
                raise
            raise InputError(e.reason, source=label) from None

    def rendered_ids(self, rec: CaptureRecord, depth_checked: bool = False) -> np.ndarray | None:
        """A record's token IDs where they are its local render tokenised (no recorded IDs, no logged
        text, no server): what the full load finds, without attributing sections or decoding. None
        where only the full load can tell (it also raises the right error). `depth_checked`: as for
        `from_record`."""
        if rec.prompt_ids is not None or isinstance(rec.prompt_text, str):
            return None
        if self.server is not None or not self._can_render():
            return None
        import numpy as np

        try:
            if not depth_checked:
                check_depth(rec.request, "record")
            request = _request_of(rec)
            if not isinstance(request.get("messages"), list):
                return None
            from tokendiff.sources.templates.env import rendered_at

            with rendered_at(_sent_at(rec), _to_llama_server(rec)):
                text = self.renderer.render(request)
            return np.asarray(self.tokenizer.encode(text), dtype=np.int32)
        except InputError:
            return None

    def sectioning(self, rec: CaptureRecord, ids: np.ndarray, label: str) -> tuple[Sectioning | str, ...] | None:
        """How the full load of this record (`from_record`) sections its prompt, found without sectioning
        it: by the request's fields when its IDs decoded are its local render byte for byte (with how its
        messages hold their text: `_text_layout`), else by the template's markers (the same "local render
        differs" warning given); with the family. None where
        only the full load can tell, or it would raise (it then says why) or warn of another tokenizer."""
        try:
            check_depth(rec.request, label)
            request, fields = _converted_of(rec)
        except InputError:
            return None
        if rec.prompt_ids is None or fields or self.family is not None or not len(ids):
            return None  # fields renamed for another API, a family forced: the full load decides
        data, fam = self._read_next(ids)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return None
        if fam is None or text.count("\ufffd") > max(8, len(ids) // 50):
            return None  # no family's markers, or mojibake: the load warns or refuses
        if not (isinstance(request.get("messages"), list) and request["messages"] and self._can_render()):
            return Sectioning.MARKERS, fam
        from tokendiff.sources.templates.env import rendered_at

        try:
            with rendered_at(_sent_at(rec), _to_llama_server(rec)):
                local = self.renderer.render(request)
                same = local == text or self.renderer.confirms(request, text)
            if same:
                return Sectioning.FIELDS, fam, _text_layout(request["messages"])
        except InputError:
            return None
        _render_differs(label, local.encode("utf-8"), data)
        return Sectioning.MARKERS, fam

    def slot_sectionings(self, arrays: Sequence[np.ndarray]) -> list[tuple[Sectioning, str, str] | None]:
        """How the full load of each slot file (`_slot`) sections its prompt: by the template's markers of the
        family its special tokens tell, no request; None where a family is forced or none is found. A directory's
        prompts read together, their special tokens found in one pass (`Vocab.special_ids_each`: each array's
        own, as `special_ids` finds them). Their IDs must be the vocabulary's (none negative, none past it): the
        reader checks that first (app.session's `_fitting`) and sends any other file to the full load."""
        from tokendiff.core.tails import SLOT_SECTIONING

        if self.family is not None:
            return [None] * len(arrays)
        full = [a for a in arrays if len(a)]
        specials = iter(self.vocab.special_ids_each(full))
        out: list[tuple[Sectioning, str, str] | None] = []
        for a in arrays:
            fam = self._family_of_specials(next(specials)) if len(a) else None
            out.append((Sectioning.MARKERS, fam, SLOT_SECTIONING) if fam not in (None, "none") else None)
        return out

    def _read_next(self, ids: np.ndarray) -> tuple[bytes, str | None]:
        """The bytes of `ids` and the family their special tokens tell (`_family_of`), what they share with the
        IDs `sectioning` read before taken from those: a session's prompt repeats most of the one before it.
        The bytes: `_decoded_after`. The special tokens: the ones before their common prefix's end are the
        previous prompt's there (kept as positions), only those after it are looked for."""
        import numpy as np

        from tokendiff.core.align import common_prefix

        last = self._last_read
        n = common_prefix(last[0], ids) if last is not None else 0
        if self._flags is None:
            self._flags = np.frombuffer(bytes(self.vocab.flags), dtype=np.uint8) & SPECIAL
        marks = n + np.flatnonzero(self._flags[ids[n:]])
        if last is None or n == 0:
            data = self.vocab.decode(ids)[0]
        else:
            data = _decoded_after(self.vocab, (last[0], last[1]), ids, n)
            marks = np.concatenate([last[2][: np.searchsorted(last[2], n)], marks])
        self._last_read = (ids, data, marks)
        return data, self._family_of_specials(set(ids[marks].tolist()))

    def _family_of(self, ids: np.ndarray) -> str | None:
        """The template family the prompt's special tokens tell (what `grammar.annotate` finds)."""
        return self._family_of_specials(self.vocab.special_ids(ids))

    def _family_of_specials(self, specials: Iterable[int]) -> str | None:
        """The family these special token IDs tell, found once per set of them."""
        key = tuple(sorted(specials))
        if key not in self._families:  # a session's prompts hold one or two sets of special tokens
            if len(self._families) >= 256:
                self._families.clear()
            self._families[key] = grammar.family_of_specials({self.vocab.piece(i) for i in key})
        return self._families[key]

    def _from_record(
        self,
        rec: CaptureRecord,
        label: str,
        turn: int | None,
        rendered_ids: np.ndarray | None = None,
        depth_checked: bool = False,
    ) -> Prompt:
        if not depth_checked:
            check_depth(rec.request, label)
        request, fields = _converted_of(rec)
        meta = _record_meta(rec, request, label, turn)
        if rec.prompt_ids is not None or rendered_ids is not None:
            p, rendered = self._decoded_first(rec, request, label, meta, rendered_ids)
        else:  # the render is the prompt: a bad messages field is an error
            rendered = self.renderer.attribute(request) if "messages" in request else None
            ids = self._record_ids(rec, request, rendered, label, meta)
            p = self._decode(ids, label, label, meta)
        fam = grammar.annotate(p, self.family, inner=rendered is None)
        if rendered is not None and fields:
            from tokendiff.sources.importers.apis import relabel

            rendered = relabel(rendered, fields)
        if rendered is not None and not _attach_render(p, rendered, label):
            grammar.annotate(p, self.family)  # the markers' sections stay: with their finer ones
        _check_tokenizer_fits(p, fam, self.family, self)
        return p

    def _decoded_first(
        self,
        rec: CaptureRecord,
        request: dict[str, Any],
        label: str,
        meta: PromptMeta,
        rendered_ids: np.ndarray | None,
    ) -> tuple[Prompt, Rendered | None]:
        """The prompt of a record whose IDs are known (the server's, or its render tokenised already),
        decoded before the request is attributed, so the attribution can take the decoded text as the
        render instead of rendering it once more."""
        if rec.prompt_ids is not None or rendered_ids is None:
            p = self._decode(self._record_ids(rec, request, None, label, meta), label, label, meta)
        else:
            meta.ids_from = LOCAL_RENDER_IDS
            p = self._decode(rendered_ids, label, label, meta)
        if not (isinstance(request.get("messages"), list) and request["messages"] and self._can_render()):
            return p, None
        try:
            text: str | None = p.data.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        return p, self.renderer.attribute(request, text)

    def _request_prompt_ids(
        self, rec: CaptureRecord, request: dict[str, Any], label: str, meta: PromptMeta
    ) -> np.ndarray:
        """A raw completion prompt the record kept no IDs of (a client that sent token IDs, which the proxy does not
        fetch again): the request's own prompt, read as a request body file's is (`raw_prompt`)."""
        from tokendiff.sources.importers.openai_body import raw_prompt

        raw = replace(rec, prompt_ids=None, prompt_text=None)
        raw_prompt(raw, request["prompt"], label)  # IDs or text set, or refused: `_record_ids` ends there
        return self._record_ids(raw, request, None, label, meta)

    def _record_ids(
        self, rec: CaptureRecord, request: dict[str, Any], rendered: Rendered | None, label: str, meta: PromptMeta
    ) -> np.ndarray:
        """The token IDs, from the best source the record allows; `meta.ids_from` says which."""
        if rec.prompt_ids is not None:
            source = rec.prompt_source
            meta.ids_from = source if isinstance(source, str) else "server"
            return _recorded_ids(rec.prompt_ids, label)
        if isinstance(rec.prompt_text, str):
            meta.ids_from = rec.prompt_source if isinstance(rec.prompt_source, str) else "prompt log, tokenised here"
            ids = self._tokenise_logged(rec.prompt_text)
        elif isinstance(request.get("messages"), list) and self.server is not None:
            meta.ids_from = "llama-server /apply-template + /tokenize"
            ids = self.server.prompt_ids(request)
        elif rendered is not None:
            meta.ids_from = LOCAL_RENDER_IDS
            ids = self.tokenizer.encode(rendered.text)
        else:
            from tokendiff.sources.importers.apis import Api, api_of  # a record with neither IDs nor messages only

            if api_of(request, rec.endpoint) != Api.COMPLETION:
                raise InputError("record has neither messages, prompt_ids nor prompt_text", source=label)
            return self._request_prompt_ids(rec, request, label, meta)
        import numpy as np

        return np.asarray(ids, dtype=np.int32)

    def _tokenise_logged(self, text: str) -> list[int]:
        """A prompt log as llama-server tokenised it (add_special): with exactly one BOS where the
        model adds one, also when the logged text already starts with it."""
        m = self.vocab.meta
        if not m.add_bos:
            return self.tokenizer.encode(text)
        if m.bos_id is None:  # the BOS is not known by ID: let the tokenizer add it
            return self.tokenizer.encode(text, add_special=True)
        ids = self.tokenizer.encode(text)
        return ids if ids[:1] == [m.bos_id] else [m.bos_id, *ids]

    def _can_render(self) -> bool:
        return bool(self.chat_template or self.vocab.meta.chat_template)


COPY_RUN = 64  # IDs equal at the same places after an edit from which the bytes decoded before are taken again


def _ids_below(ids: IntArray, n_vocab: int) -> bool:
    """Every ID in [0, n_vocab), shown by one numpy max where the process has numpy (a report's) and the IDs are
    4-byte integers (a slot file's array, a parsed int32 array): read as unsigned, a negative ID is 2**31 or
    more, so it fails the compare too. False where that is not shown: `check_vocab` decides (and words the
    refusal); it takes ~20 us for a 700-token prompt, the max ~3."""
    if "numpy" not in sys.modules or not len(ids):
        return False
    try:
        view = memoryview(ids)  # type: ignore[arg-type]  # a list has no buffer
    except TypeError:
        return False
    if view.ndim != 1 or view.itemsize != 4 or view.format not in ("i", "I") or not view.c_contiguous:
        return False
    import numpy as np

    return int(np.frombuffer(view, dtype=np.uint32).max()) < n_vocab


def _decoded_after(vocab: Vocab, last: tuple[np.ndarray, bytes], ids: np.ndarray, n: int) -> bytes:
    """`vocab.decode(ids)[0]`, the IDs equal to the previous prompt's (`last`: its IDs and bytes) at the same
    places taken from its bytes: their common start (n > 0 tokens), and each run of COPY_RUN or more after
    it (what follows an edit that kept the token count: a date's digits). The bytes of IDs are their pieces
    joined, so equal IDs at any places are equal bytes; the previous prompt's bytes at a place are found from
    the byte length of its IDs after it. Only the rest is decoded."""
    import numpy as np

    prev, data = last
    k = min(len(prev), len(ids))
    differ = n + np.flatnonzero(prev[n:k] != ids[n:k])  # where they differ at the same places (n first)
    runs: list[tuple[int, int]] = []
    if differ.size:  # the runs between one place they differ and the next (or the shorter one's end)
        starts, ends = differ + 1, np.append(differ[1:], k)
        long = ends - starts >= COPY_RUN
        runs = list(zip(starts[long].tolist(), ends[long].tolist()))

    def at(i: int) -> int:  # where the previous prompt's i-th token begins in its bytes
        return len(data) - vocab.byte_length(prev[i:])

    parts, pos = [data[: at(n)]], n
    for s, e in runs:
        parts += [vocab.decode(ids[pos:s])[0], data[at(s) : at(e)]]
        pos = e
    if pos < len(ids):
        parts.append(vocab.decode(ids[pos:])[0])
    return b"".join(parts)


def _to_llama_server(rec: CaptureRecord) -> bool:
    """Whether the record's request went to llama-server: the kind its server names, llama-server where none."""
    server = rec.server if isinstance(rec.server, dict) else {}
    return bool(server.get("kind", ServerKind.LLAMA_SERVER) == ServerKind.LLAMA_SERVER)


def _sent_at(rec: CaptureRecord) -> float | None:
    """When the record's request was sent, as the server's 'today' to render it with: the capture's time,
    else a HAR entry's startedDateTime."""
    if rec.ts is not None or rec.started is None:
        return rec.ts
    from tokendiff.sources.importers.har import started_seconds

    return started_seconds(rec.started)


def _request_of(rec: CaptureRecord) -> dict[str, Any]:
    """The request as the server templates it: see `_converted_of`."""
    return _converted_of(rec)[0]


def _converted_of(rec: CaptureRecord) -> tuple[dict[str, Any], FieldMap]:
    """The request as the server templates it: Responses and Messages requests converted as the server
    that answered converts them (with the map back to their own fields), and tool-call arguments parsed
    where the server parses them (llama-server, the default when a record names none; vLLM), so a
    client's re-serialised arguments cost what they cost there: nothing, unless the keys moved."""
    from tokendiff.sources.importers.apis import chat_form

    request = rec.request or {}
    if not isinstance(request, dict):
        raise InputError(f"the record's request is a {type(request).__name__}, not a JSON object")
    server = rec.server if isinstance(rec.server, dict) else {}
    kind = server.get("kind", ServerKind.LLAMA_SERVER)
    llama = kind == ServerKind.LLAMA_SERVER
    request, fields = chat_form(request, rec.endpoint if isinstance(rec.endpoint, str) else None, str(kind or ""))
    parses_arguments = llama or kind == ServerKind.VLLM  # as a real vLLM 0.32 does (tests/live/test_vllm.py)
    if parses_arguments and isinstance(request, dict):
        request = _parsed_arguments(request)
    return request, fields


def _record_meta(rec: CaptureRecord, request: dict[str, Any], label: str, turn: int | None) -> PromptMeta:
    server = rec.server
    model = server.get("model") if isinstance(server, dict) else None
    response = rec.response
    return PromptMeta(
        path=one_line(str(rec.origin or label)),
        format=rec.source,
        turn=turn,
        request=request,
        response=response if isinstance(response, dict) else None,
        server_model=str(model) if model else None,
    )


def _recorded_ids(ids_in: Any, label: str) -> np.ndarray:
    """The record's `prompt_ids`, checked to be a flat list of 32-bit token IDs."""
    import numpy as np

    try:
        ids = np.asarray(ids_in, dtype=np.int64)
        if ids.ndim != 1:
            raise ValueError("not a flat list")
    except (TypeError, ValueError, OverflowError) as e:
        raise InputError(f"prompt_ids is not a list of token IDs: {e}", source=label) from None
    if ids.size and (ids.min() < 0 or ids.max() >= 2**31):
        raise InputError("prompt_ids holds negative or oversized IDs", source=label)
    return ids.astype(np.int32)


def _attach_render(p: Prompt, rendered: Rendered, label: str) -> bool:
    """Sections from the request fields when the local render is the prompt byte for byte (True);
    otherwise say where they part (itself a finding) and leave the template markers' sections."""
    local = rendered.text.encode("utf-8")
    matched = local == p.data
    if matched:
        from tokendiff.core.sections import field_sections

        p.sections = field_sections(p, rendered)
        p.meta.sections_from = "request fields"
    else:
        p.meta.render_mismatch = _render_differs(label, local, p.data, p.meta.ids_from != LOCAL_RENDER_IDS)
    if rendered.unlocated:
        p.meta.unlocated_fields = rendered.unlocated
    return matched


def _text_layout(messages: list[Any]) -> str:
    """How a request's messages hold their text, as far as a field path reads it: all as strings, all as one
    text part, or else MIXED_CONTENT (a tail form keys on it; an edit form is refused for the last)."""
    from tokendiff.core.tails import MIXED_CONTENT

    kinds = set()
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if content is None:
            continue
        if isinstance(content, str):
            kinds.add("strings")
        elif isinstance(content, list) and len(content) == 1 and isinstance(content[0], dict):
            kinds.add(f"one {content[0].get('type')!r} part")
        else:
            return MIXED_CONTENT
    return kinds.pop() if len(kinds) == 1 else "strings" if not kinds else MIXED_CONTENT


def _render_differs(label: str, local: bytes, data: bytes, server: bool = True) -> RenderMismatch:
    """Where the local render parts from the server's tokens, said to the user; or, where the IDs are the
    render's own tokens (`server` False), where those spell other bytes: the tokenizer normalises the text
    (Qwen's NFC), and no server is involved."""
    from tokendiff.core.align import first_byte_diff

    at = first_byte_diff(local, data)
    lo, hi = max(0, (at or 0) - 40), (at or 0) + 40
    why = (
        f"the local render differs from the server's tokens at byte {at}; "
        "sections come from the template markers (the server renders differently)"
        if server
        else f"the tokens of the local render spell other bytes at byte {at} (the tokenizer normalises the text); "
        "sections come from the template markers"
    )
    warn(f"{label}: {why}", kind="local render differs")
    return RenderMismatch(
        byte=at, local=local[lo:hi].decode("utf-8", "replace"), server=data[lo:hi].decode("utf-8", "replace")
    )


def _parsed_arguments(request: dict[str, Any]) -> dict[str, Any]:
    """llama-server and vLLM parse tool-call `arguments` strings into objects before templating; the
    local render must too, or it cannot match the server's tokens field by field. Only the calls are
    copied: the rest of a long request is shared with the record."""
    msgs = request.get("messages")
    if not isinstance(msgs, list) or not any(isinstance(m, dict) and m.get("tool_calls") for m in msgs):
        return request
    return {**request, "messages": [_with_parsed_calls(m) for m in msgs]}


def _with_parsed_calls(m: Any) -> Any:
    """A message with its calls' JSON-object `arguments` strings parsed (the message itself when none)."""
    import orjson

    calls = m.get("tool_calls") if isinstance(m, dict) else None
    if not isinstance(calls, list) or not calls:
        return m
    out = []
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("arguments"), str):
            out.append(call)
            continue
        try:
            parsed = orjson.loads(fn["arguments"])
        except orjson.JSONDecodeError:
            parsed = None
        out.append({**call, "function": {**fn, "arguments": parsed}} if isinstance(parsed, dict) else call)
    return {**m, "tool_calls": out}


def load_prompt(spec: str, vocab: Vocab, family: str | None = None, order: str = "auto") -> Prompt:
    return Loader(vocab, family, order).load(spec)


MISMATCH_HINT = (
    "pass --tokenizer with the model's tokenizer.json, HF directory or GGUF file "
    "(or --template-family to read it with this one anyway)"
)
MIN_ROUND_TRIP = 0.8  # the model's own tokenizer re-encodes its decoded prompt to ~100% of the tokens


def _check_tokenizer_fits(prompt: Prompt, fam: str, forced: str | None, loader: Loader) -> None:
    """IDs inside the vocabulary can still belong to another model, and then the text is garbage:
    refuse (exit 2) when the text shows it, unless the user forced a template family."""
    if len(prompt) < 16:
        return
    vocab = loader.vocab.name
    data = prompt.data  # ASCII decodes to no replacement character: not decoded
    bad = 0 if data.isascii() else data.decode("utf-8", errors="replace").count("\ufffd")
    if bad > max(8, len(prompt) // 50):
        why = f"{bad} invalid UTF-8 sequences after decoding with {vocab}"
    elif fam == "none" and _stray_specials(prompt):
        why = f"no chat-template markers, but {_stray_specials(prompt)} control tokens of {vocab} inside the text"
    elif fam == "none":
        ratio = _round_trip(prompt, loader)
        if forced is not None and (ratio is None or ratio >= MIN_ROUND_TRIP):
            return
        if ratio is None or ratio >= MIN_ROUND_TRIP:
            warn(
                f"{prompt.origin}: no chat-template markers found with {vocab}; sections are unavailable "
                "(a raw completion prompt, or not the model's tokenizer: pass --tokenizer)",
                kind="no chat-template markers",
            )
            return
        why = (
            f"no chat-template markers, and only {ratio:.0%} of the {len(prompt)} tokens come back when the "
            f"decoded text is tokenised again with {vocab}"
        )
    else:
        return
    if forced is not None:
        warn(f"{prompt.origin}: {why}; the tokenizer is probably not the model's", kind="tokenizer not the model's")
        return
    raise InputError(f"{why}: the tokenizer is not the model's; {MISMATCH_HINT}", source=prompt.origin)


def _stray_specials(prompt: Prompt) -> int:
    """Control tokens after the first: a prompt without template markers holds at most a BOS, so
    control tokens inside its text are another vocabulary's IDs."""
    import numpy as np

    ids = np.asarray(prompt.ids)
    return int(np.count_nonzero(np.asarray(prompt.special)[1:] & (ids[1:] >= 0)))


def _round_trip(prompt: Prompt, loader: Loader) -> float | None:
    """The share of the prompt's tokens found again when its decoded text is tokenised (as a multiset);
    None when this tokenizer cannot tokenise text. The model's own tokenizer gives ~100%; another
    vocabulary decodes to pieces that merge differently."""
    from collections import Counter

    import numpy as np

    try:
        again = loader.tokenizer.encode(prompt.data.decode("utf-8", errors="replace"))
    except InputError:
        return None
    common = Counter(np.asarray(prompt.ids).tolist()) & Counter(again)
    return sum(common.values()) / len(prompt)


def _props_template(path: Path) -> str | None:
    """The chat template of a server's saved /props (None: no file, or no template in it)."""
    props = read_props(path)
    tmpl = props.get("chat_template") if props is not None else None
    return tmpl if isinstance(tmpl, str) and tmpl.strip() else None


def read_props(path: Path) -> dict[str, Any] | None:
    """A server's `/props` saved as JSON (by the proxy or `pull`): the server's own document, read within
    MAX_PROPS_BYTES; None when the file is absent, unreadable or not a JSON object."""
    import orjson  # deferred: `tokendiff diff` reads no props

    if not path.is_file():
        return None
    try:
        doc = orjson.loads(safeio.read_limited(path, MAX_PROPS_BYTES, "props.json"))
    except (InputError, orjson.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def saved_props(paths: Sequence[str]) -> dict[str, Any] | None:
    """The server's `/props` saved beside a session (props.json beside a capture or in a slot directory):
    the first of `paths` that has one; None when none does."""
    for p in paths:
        base = Path(selector_base(p))
        doc = read_props((base if base.is_dir() else base.parent) / "props.json")
        if doc is not None:
            return doc
    return None
