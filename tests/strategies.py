"""Structure-aware Hypothesis strategies for the readers: inputs with valid magic, headers and
shapes and random details, so that generated examples reach the deep code (the payload unpacker,
the renderer, the HAR entry reader) instead of stopping at the first check.

Each strategy draws `bytes` (files) or a JSON-able object (documents). The atheris harness in fuzz/
can drive them with the same bytes it mutates: wrap a check in `@given(strategy)` and call
`check.hypothesis.fuzz_one_input(data)` from atheris' TestOneInput.
"""

from __future__ import annotations

import json
import struct

from hypothesis import strategies as st

MAGIC_GGSQ, MAGIC_GGSN = 0x67677371, 0x6767736E
QWEN_IDS = [151643, 151644, 151645, 198, 872, 8948, 9707, 1879, 0, 42, 151667, 151668]

token_ids = st.one_of(st.sampled_from(QWEN_IDS), st.integers(0, 151668), st.integers(-2, 2**31 - 1))


@st.composite
def packed_payloads(draw) -> bytes:
    """llama-server's packed token payload with random counts, media cells, chunks and padding."""
    tokens = draw(st.lists(st.one_of(token_ids, st.just(-1)), max_size=40))
    media_at = [i for i, t in enumerate(tokens) if t == -1]
    starts = draw(st.lists(st.sampled_from(media_at) if media_at else st.integers(0, 50), max_size=3))
    chunks = draw(st.lists(st.binary(max_size=24), min_size=len(starts), max_size=len(starts)))
    c = draw(st.one_of(st.just(len(tokens)), st.integers(0, 60)))
    k = draw(st.one_of(st.just(len(starts)), st.integers(0, 5)))
    version = draw(st.sampled_from([1, 1, 1, 0, 2]))
    out = struct.pack("<iII", -1, version, c) + struct.pack(f"<{len(tokens)}i", *tokens)
    out += struct.pack("<I", k) + b"".join(struct.pack("<I", s) for s in starts)
    out += b"".join(struct.pack("<I", draw(st.sampled_from([len(b), len(b) + 7]))) + b for b in chunks)
    return out + b"\0" * draw(st.sampled_from([-len(out) % 4, 0, 5]))


@st.composite
def slot_files(draw) -> bytes:
    """A slot file with a valid magic and header: random versions, counts, plain or packed payloads,
    state blobs (ggsn arch names) and truncations."""
    magic = draw(st.sampled_from([MAGIC_GGSQ, MAGIC_GGSN]))
    versions = [1, 2, 3, 4, 5, 0, 256] if magic == MAGIC_GGSQ else [8, 9, 10, 11, 12, 7, 256]
    version = draw(st.sampled_from(versions[:4] * 3 + versions[4:]))
    payload = draw(st.one_of(packed_payloads(), st.lists(token_ids, max_size=40).map(_plain)))
    exact = st.just(len(payload) // 4)
    n = draw(st.one_of(exact, exact, exact, st.integers(0, 64), st.just(2**32 - 1)))
    arch = draw(st.sampled_from([b"qwen3", b"llama", b"\xff\xfe", b""]))
    state = draw(st.one_of(st.just(struct.pack("<I", len(arch)) + arch), st.binary(max_size=32)))
    raw = struct.pack("<III", magic, version, n) + payload + state
    cut = draw(st.one_of(st.none(), st.none(), st.none(), st.integers(0, len(raw))))
    return raw if cut is None else raw[:cut]


def _plain(tokens: list[int]) -> bytes:
    return struct.pack(f"<{len(tokens)}i", *tokens)


# ---------------------------------------------------------------- OpenAI request bodies

texts = st.text(max_size=24)
json_scalars = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | texts
any_json = st.recursive(
    json_scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(texts, c, max_size=3), max_leaves=12
)

content_parts = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": texts}),
    st.fixed_dictionaries({"text": texts}),
    st.fixed_dictionaries({"type": st.just("image_url"), "image_url": st.fixed_dictionaries({"url": texts})}),
    st.fixed_dictionaries({"type": st.sampled_from(["video", "input_audio", "file"])}),
    any_json,
)
contents = st.one_of(texts, st.none(), st.lists(content_parts, max_size=3), any_json)
arguments = st.one_of(
    st.dictionaries(texts, json_scalars, max_size=3).map(lambda d: json.dumps(d)),
    st.dictionaries(texts, json_scalars, max_size=3),
    texts,
    any_json,
)
tool_calls = st.lists(
    st.one_of(
        st.fixed_dictionaries(
            {
                "id": texts,
                "type": st.just("function"),
                "function": st.fixed_dictionaries({"name": texts, "arguments": arguments}),
            }
        ),
        any_json,
    ),
    max_size=2,
)
roles = st.sampled_from(["system", "user", "assistant", "tool", "developer", "ipython", ""]) | any_json
messages = st.one_of(
    st.fixed_dictionaries(
        {"role": roles, "content": contents},
        optional={"tool_calls": tool_calls, "tool_call_id": texts, "reasoning_content": texts, "name": texts},
    ),
    any_json,
)
functions = st.fixed_dictionaries(
    {"name": texts}, optional={"description": texts, "parameters": st.dictionaries(texts, any_json, max_size=2)}
)
tools = st.lists(
    st.one_of(st.fixed_dictionaries({"type": st.just("function"), "function": functions}), functions, any_json),
    max_size=3,
)


@st.composite
def request_bodies(draw) -> dict:
    """OpenAI chat bodies: mostly valid shapes (content parts, tool arrays, tool calls, arguments as
    strings or objects, legacy `functions`), with invalid details mixed in."""
    valid = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]), "content": texts})
    body: dict = {"messages": draw(st.lists(valid | valid | messages, min_size=1, max_size=4) | any_json)}
    if draw(st.booleans()):
        body["tools"] = draw(tools | any_json)
    if draw(st.booleans()):
        body["functions"] = draw(st.lists(functions, max_size=2))
    if draw(st.booleans()):
        body["chat_template_kwargs"] = draw(st.dictionaries(st.sampled_from(["enable_thinking", "x"]), any_json))
    return body


# ---------------------------------------------------------------- HAR files


@st.composite
def har_documents(draw) -> dict:
    """HAR 1.2 with valid structure and wrong details: methods, URLs, base64, SSE and JSON responses."""
    entries = []
    for _ in range(draw(st.integers(0, 3))):
        body = json.dumps(draw(request_bodies()))
        text = draw(st.sampled_from(["plain", "b64", "bad64", "garbage"]))
        post: dict = {"mimeType": "application/json", "text": body}
        if text == "b64":
            import base64

            post.update(text=base64.b64encode(body.encode()).decode(), encoding="base64")
        elif text == "bad64":
            post.update(text="!!", encoding="base64")
        elif text == "garbage":
            post["text"] = draw(any_json)
        resp_text = draw(st.sampled_from(['{"choices": []}', "data: {}\n\ndata: [DONE]\n\n", "", "{"]))
        entry = {
            "request": {
                "method": draw(st.sampled_from(["POST", "GET", "post"])),
                "url": draw(st.sampled_from(["http://h/v1/chat/completions", "http://h/other", "http://[", "x"])),
                "postData": draw(st.one_of(st.just(post), any_json)),
            },
            "response": {"status": 200, "content": {"mimeType": "text/event-stream", "text": resp_text}},
            "timings": {"wait": draw(st.one_of(st.floats(allow_nan=False), texts))},
        }
        entries.append(draw(st.one_of(st.just(entry), any_json)))
    return {"log": {"version": "1.2", "entries": entries}}


# ---------------------------------------------------------------- tokenizer.json


@st.composite
def tokenizer_documents(draw) -> dict:
    """tokenizer.json with a plausible model and wrong details: ids missing, negative, huge or of
    the wrong type, added tokens without content, decoders of any kind."""
    ids = st.one_of(st.integers(0, 300), st.integers(-5, -1), st.just(400_000_000), texts, st.none())
    vocab = draw(st.one_of(st.dictionaries(texts, ids, max_size=6), st.lists(st.lists(any_json, max_size=2)), any_json))
    added = st.fixed_dictionaries({"content": st.one_of(texts, any_json)}, optional={"id": ids, "special": any_json})
    return {
        "model": draw(st.one_of(st.fixed_dictionaries({"type": st.just("BPE"), "vocab": st.just(vocab)}), any_json)),
        "added_tokens": draw(st.one_of(st.lists(added, max_size=3), any_json)),
        "decoder": draw(st.one_of(st.just({"type": "ByteLevel"}), st.just({"type": "ByteFallback"}), any_json)),
        "post_processor": draw(any_json),
    }


# ---------------------------------------------------------------- capture files

SCHEMA = "tokendiff.capture/1"
CHATML_TEXT = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@st.composite
def request_body_fields(draw) -> dict:
    """`request_body` as the proxy writes it (inline base64 or a blob name, sha256 right or
    wrong, omitted), or any JSON."""
    import base64
    import hashlib

    data = draw(st.one_of(request_bodies().map(lambda b: json.dumps(b).encode()), st.binary(max_size=40)))
    digest = draw(st.one_of(st.just(hashlib.sha256(data).hexdigest()), st.just("0" * 64), texts))
    body: dict = {"bytes": len(data), "sha256": digest, "verbatim": draw(st.booleans())}
    where = draw(st.sampled_from(["base64", "blob", "omitted", "bad64"]))
    if where == "base64":
        body["base64"] = base64.b64encode(data).decode()
    elif where == "blob":
        body["blob"] = draw(st.sampled_from([f"blobs/{digest}", "blobs/../x", "/etc/passwd", ""]))
    elif where == "omitted":
        body["omitted"] = "over the 128 MiB cap"
    else:
        body["base64"] = "!!"
    return draw(st.one_of(st.just(body), st.just(body), any_json))


def _field(right, wrong=any_json):
    """Mostly the right type, sometimes any JSON: every field of the wrong type now and then."""
    return st.one_of(right, right, right, wrong)


@st.composite
def capture_records(draw, seq: int = 1) -> dict:
    """One capture record: documented fields of the right or a wrong type, a request or a
    request_body, recorded IDs or a logged prompt text, a response with usage and timings."""
    ints = st.integers(0, 1 << 20)
    rec: dict = {"schema": draw(st.one_of(st.just(SCHEMA), st.just(SCHEMA), texts)), "seq": draw(_field(st.just(seq)))}
    if draw(st.booleans()):
        rec["request"] = draw(_field(request_bodies()))
    else:
        rec["request_body"] = draw(request_body_fields())
    optional = {
        "ts": st.floats(0, 2e9),
        "source": st.sampled_from(["proxy", "har"]),
        "endpoint": st.sampled_from(["/v1/chat/completions", "/v1/messages", "/completion"]),
        "prompt_ids": st.lists(token_ids, max_size=30),
        "prompt_text": st.one_of(st.just(CHATML_TEXT), texts),
        "prompt_source": texts,
        "redacted": st.lists(texts, max_size=2),
        "response": st.fixed_dictionaries(
            {"status": st.just(200)},
            optional={
                "usage": st.fixed_dictionaries({"prompt_tokens": _field(ints)}),
                "timings": st.fixed_dictionaries({"cache_n": _field(ints), "prompt_ms": _field(st.floats(0, 1e6))}),
                "streamed": st.booleans(),
                "error": st.one_of(texts, any_json),
            },
        ),
        "ttft_ms": st.floats(0, 1e6),
        "client_disconnected": st.booleans(),
        "server": st.fixed_dictionaries({"kind": st.just("llama-server"), "model": texts}),
    }
    for key in draw(st.lists(st.sampled_from(sorted(optional)), max_size=5, unique=True)):
        rec[key] = draw(_field(optional[key]))
    return rec


@st.composite
def capture_files(draw) -> bytes:
    """capture.jsonl: records, patches for earlier (or missing) records, blank lines, a torn
    or malformed line."""
    lines: list[bytes] = []
    n = draw(st.integers(1, 3))
    for seq in range(1, n + 1):
        lines.append(json.dumps(draw(capture_records(seq))).encode())
        if draw(st.booleans()):
            patch = {"schema": SCHEMA, "seq": n + seq, "patch": draw(st.sampled_from([seq, seq + 7, -1]))}
            patch["prompt_ids"] = draw(_field(st.lists(token_ids, max_size=20)))
            lines.append(json.dumps(patch).encode())
    extra = draw(st.sampled_from([b"", b"", b"\n", b'{"schema": ', b"[1, 2]", b"\xff\xfe"]))
    return b"\n".join(lines) + b"\n" + extra
