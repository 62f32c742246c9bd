"""The pair workflow of the application layer: options, the prompt loader, a pair aligned and explained,
its `tokendiff.diff/2` bytes.

Apart from the session workflows (app.session, app.reports ...) so that `tokendiff diff` imports only what a diff
runs: the session, report, replay and fleet machinery costs ~10 ms of imports it never uses (issue #12).
"""

from __future__ import annotations

from functools import cached_property

from tokendiff.core.plain import plain
from tokendiff.errors import InputError

TYPE_CHECKING = False  # no `typing` at run time: `tokendiff diff` imports this module (core/plain.py)
if TYPE_CHECKING:
    from tokendiff.core.model import Divergence, Finding, Prompt
    from tokendiff.core.vocab import Vocab
    from tokendiff.report.schema import DiffDocument
    from tokendiff.sources.loader import Loader


@plain(frozen=True)
class PromptOptions:
    """How prompts are read; the same for every command and the TUI."""

    tokenizer: str | None = None  # tokenizer.json(.gz), a Hugging Face directory or a GGUF file
    server: str | None = None  # a live llama-server to decode (and tokenise) with
    chat_template: str | None = None  # a .jinja file or a tokenizer_config.json
    family: str | None = None  # template family override
    order: str = "auto"  # turn order in a directory: auto (slot files by mtime, the rest by name) | mtime | name


MAX_TEMPLATE_BYTES = 64 << 20  # a .jinja is KBs; a tokenizer_config.json with 260k added tokens is tens of MB


def read_chat_template(path: str | None) -> str | None:
    """A chat template from a .jinja file, or the `chat_template` of a tokenizer_config.json."""
    if not path:
        return None
    from tokendiff.safeio import read_text_limited

    try:
        text = read_text_limited(path, MAX_TEMPLATE_BYTES, "chat template")
    except InputError as e:
        raise InputError(f"cannot read chat template: {e.reason}", source=path) from None
    if not path.endswith(".json"):
        return text
    import orjson

    try:
        cfg = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise InputError(f"malformed JSON: {e}", source=path) from None
    from tokendiff.sources.tokenizers import config_template

    tmpl = config_template(cfg) if isinstance(cfg, dict) else None
    if tmpl is None:  # as a tokenizer directory's tokenizer_config.json is read
        raise InputError("no chat_template string (nor a list of named ones) in this JSON file", source=path)
    return tmpl


def open_loader(opts: PromptOptions) -> Loader:
    """The vocabulary and a prompt loader for these options (the vocabulary is `loader.vocab`)."""
    from tokendiff.sources.loader import Loader
    from tokendiff.sources.tokenizers import load_vocab

    if not opts.server:
        tmpl = read_chat_template(opts.chat_template)
        return Loader(load_vocab(opts.tokenizer), opts.family, opts.order, tmpl, template_name=opts.chat_template)
    return _server_loader(opts, opts.server)


def _server_loader(opts: PromptOptions, url: str) -> Loader:
    """With --server: the server's chat template unless one is named; its vocabulary unless a tokenizer is
    named, and then it renders and tokenises requests too."""
    from tokendiff.backends.server import served_template
    from tokendiff.backends.tokenizer import ServerPrompts, load_server
    from tokendiff.sources.loader import Loader
    from tokendiff.sources.tokenizers import load_vocab

    vocab = load_vocab(opts.tokenizer) if opts.tokenizer else load_server(url)
    tmpl, name = read_chat_template(opts.chat_template), opts.chat_template
    if tmpl is None:  # the template the server renders with (issue #13)
        tmpl, name = served_template(url, vocab.meta.chat_template, vocab.name), f"{url}/props"
    server = ServerPrompts(vocab.meta.server) if vocab.meta.server else None
    return Loader(vocab, opts.family, opts.order, tmpl, server, template_name=name)


class PairResult:
    """Two prompts, how they diverge and why; `document` is the `tokendiff.diff/2` document.
    (A plain class: a dataclass costs ~0.7 ms to create at import, in every `tokendiff diff`.)"""

    def __init__(
        self, a: Prompt, b: Prompt, divergence: Divergence, findings: list[Finding], vocab: Vocab, context: int = 8
    ):
        self.a, self.b, self.divergence, self.findings, self.vocab = a, b, divergence, findings, vocab
        self.context = context  # tokens of context around spans in the document

    @cached_property
    def document(self) -> DiffDocument:
        from tokendiff.report.diff import diff_document

        return diff_document(self.a, self.b, self.divergence, self.vocab, context=self.context, findings=self.findings)


def llama_reusable(a: Prompt, b: Prompt, divergence: Divergence) -> int:
    """The tokens of B llama-server reuses after A, as the session table counts them (a full hit still
    evaluates one token)."""
    from tokendiff.core.cost import backend_reuse
    from tokendiff.core.kinds import Backend

    return backend_reuse(Backend.LLAMA_CPP, divergence.lcp, len(b), len(a))


def diff_pair(a: Prompt, b: Prompt, vocab: Vocab, context: int = 8) -> PairResult:
    from tokendiff.core.align import align
    from tokendiff.core.explain import explain

    d = align(a, b)
    return PairResult(a, b, d, explain(a, b, d), vocab, context)


def load_pair(loader: Loader, spec_a: str, spec_b: str, context: int = 8) -> PairResult:
    a = loader.load(spec_a)
    b = loader.load(spec_b, like=a)  # B mostly repeats A: what it shares is copied, not decoded again
    return diff_pair(a, b, loader.vocab, context)


def pair_json(pair: PairResult) -> bytes:
    """The bytes `tokendiff diff --json` prints."""
    from tokendiff.report.diff import document_json

    return document_json(pair.document)
