"""vLLM's KV-cache events: the wire format (vLLM 0.32's tagged maps and older releases' arrays), the
recorder on a real ZMQ socket, and the eviction verdict a report draws from them."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import time

import msgpack
import pytest
import zmq

from tokendiff.backends.kv_events import KvEventRecorder, subscriber_endpoint
from tokendiff.core.cache.kv_events import EVICTED, KvBatch, StoredBlocks, TurnBlocks, evictions
from tokendiff.errors import InputError
from tokendiff.notices import sink
from tokendiff.sources.kv_events import batch_of, decode_message, iter_kv_events, plain_batch
from tokendiff.testing.llama_server import free_port
from tokendiff.testing.proxy_process import run_proxy

BIG = 9580478765297320230  # vLLM's hashes are the low 64 bits, unsigned: past int64


def stored(hashes, parent, ids, size=4) -> dict:
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": ids,
        "block_size": size,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }


def message(ts: float, events: list, seq: int = 0, topic: bytes = b"kv") -> list[bytes]:
    """What vLLM's ZmqEventPublisher sends: topic, an 8-byte big-endian seq, the msgpack batch [ts, events, rank]."""
    return [topic, seq.to_bytes(8, "big"), msgpack.packb([ts, events, 0])]


def test_both_wire_layouts_decode_to_the_same_lines():
    new = message(
        1.5,
        [
            stored([BIG, 7], None, list(range(8))),
            {"type": "BlockRemoved", "block_hashes": [BIG], "medium": "GPU"},
            {"type": "AllBlocksCleared"},
        ],
        seq=3,
    )
    old = message(
        1.5,
        [
            ["BlockStored", [BIG, 7], None, list(range(8)), 4, None, "GPU"],
            ["BlockRemoved", [BIG], "GPU"],
            ["AllBlocksCleared"],
        ],
        seq=3,
    )
    a, b = decode_message(new), decode_message(old)
    assert a is not None and b is not None
    assert a["events"] == b["events"] and a["seq"] == 3 and a["topic"] == "kv" and a["ts"] == 1.5
    assert a["events"][0]["block_hashes"] == [str(BIG), "7"] and a["events"][0]["token_ids"] == list(range(8))
    assert [e["type"] for e in a["events"]] == ["BlockStored", "BlockRemoved", "AllBlocksCleared"]
    by_bytes = decode_message(message(2.0, [{"type": "BlockRemoved", "block_hashes": [b"\x01\xff"], "medium": "GPU"}]))
    assert by_bytes["events"][0]["block_hashes"] == ["01ff"]
    assert decode_message([b"kv", b"\x00" * 8, b"\xc1not msgpack"]) is None
    assert decode_message([b"kv", b"\x00" * 8, msgpack.packb({"no": "batch"})]) is None
    offload = batch_of({"ts": 1.0, "events": [{"type": "BlockRemoved", "block_hashes": ["5"], "medium": "CPU"}]})
    assert offload == KvBatch(1.0)  # an offload tier's removal: the main pool still has the block


def test_odd_event_lines_are_data():
    """Unknown event types, fields of other types, a hash of 5,000 digits, `true` as a block size: each event
    kept or dropped as what it is, a line that is no batch counted, never an exception."""
    odd = [
        {"type": "BlockStored", "block_hashes": ["a"], "token_ids": [1, 2], "block_size": True, "medium": "GPU"},
        {"type": "SomethingNewer", "block_hashes": [1]},
        {"type": "BlockRemoved", "block_hashes": "abc", "medium": [1]},
        5,
        None,
        stored([1, 2], {"x": 1}, [1, 2, 3, 4]),
    ]
    assert batch_of({"ts": 2.0, "events": odd}) == KvBatch(
        2.0, stored=(StoredBlocks(("1", "2"), None, (1, 2, 3, 4), 4),)
    )
    line = plain_batch([2.0, odd, 0])
    assert (
        line is not None and line["events"][0]["block_size"] is None and line["events"][1] == {"type": "SomethingNewer"}
    )


@pytest.fixture
def publisher():
    """A PUB socket bound as vLLM's publisher binds: (the socket, its port)."""
    port = free_port()
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.bind(f"tcp://127.0.0.1:{port}")
    yield pub, port
    pub.close(linger=0)
    ctx.term()


def _send_until(rec: KvEventRecorder, pub, batches: int, messages, seq: int = 0) -> None:
    """`messages(seq)` sent every 50 ms, seq counting up, until the recorder holds `batches` (a PUB drops what
    it sends before the SUB has joined), 30 s at most."""
    deadline = time.monotonic() + 30
    while rec.batches < batches and time.monotonic() < deadline:
        for m in messages(seq):
            pub.send_multipart(m)
        seq += 1
        time.sleep(0.05)


def test_the_recorder_writes_what_a_publisher_sends(tmp_path, publisher):
    pub, port = publisher
    out = tmp_path / "kv-events.jsonl"
    rec = KvEventRecorder(f"tcp://*:{port}", out, topic="kv").start()  # vLLM's bind address, as it is configured
    try:
        _send_until(  # another topic's message besides each: not ours
            rec,
            pub,
            3,
            lambda k: [message(100.0 + k, [stored([k], None, [1, 2, 3, 4])], seq=k), message(0.0, [], 999, b"x")],
        )
    finally:
        rec.stop()
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) >= 3 and all(x["topic"] == "kv" for x in lines)
    assert [x["seq"] for x in lines] == sorted(x["seq"] for x in lines)
    assert len(list(iter_kv_events(out))) == len(lines)
    assert oct(out.stat().st_mode & 0o777) == "0o600"


def test_an_evicted_block_inside_the_reusable_prefix_is_the_verdict():
    a = list(range(100, 112))  # three 4-token blocks
    batches = [
        KvBatch(1.0, stored=(StoredBlocks(("h1", "h2", "h3"), None, tuple(a), 4),)),
        KvBatch(3.0, removed=("h3",)),  # the tail block, evicted while turn 2 ran
        KvBatch(5.5, stored=(StoredBlocks(("h3",), "h2", tuple(a[8:12]), 4),)),  # stored again by turn 3 itself
    ]
    turns = [
        TurnBlocks(turn=1, start=0.5, ids=a, predicted=0),
        TurnBlocks(turn=2, start=2.0, ids=list(range(500, 520)), predicted=0),
        TurnBlocks(turn=3, start=5.0, ids=[*a, 7], predicted=12, reported=8),
        TurnBlocks(turn=4, start=6.0, ids=[*a, 7, 8], predicted=12, reported=12),  # back in the cache: no verdict
    ]
    (e,) = evictions(turns, batches)
    assert (e.turn, e.first_block, e.blocks, e.tokens, e.evicted_at) == (3, 2, 1, 4, 3.0)
    # blocks the events never stored (another salt, another model) say nothing
    assert evictions([TurnBlocks(turn=1, start=9.0, ids=list(range(12)), predicted=12)], batches) == []


def test_the_events_are_a_stream_put_in_time_order_within_a_bounded_window():
    """Was `sorted` of the whole file's batches (token IDs and all) in memory: a long recording grew without bound.
    A stream in publish order give or take a few gives the sorted answer, and is read only as far as the turns
    need, a window ahead."""
    import random

    from tokendiff.core.cache.kv_events import REORDER

    a = list(range(100, 112))
    events = [
        KvBatch(1.0, stored=(StoredBlocks(("h1", "h2", "h3"), None, tuple(a), 4),)),
        KvBatch(3.0, removed=("h3",)),
        *(KvBatch(3.0 + k / 1000, removed=(f"x{k}",)) for k in range(3 * REORDER)),
    ]
    turns = [TurnBlocks(turn=3, start=5.0, ids=[*a, 7], predicted=12, reported=8)]
    want = evictions(turns, sorted(events, key=lambda b: b.ts))
    near = events[:]
    for i in range(0, len(near) - 8, 8):  # each batch a few places from its place in time
        near[i : i + 8] = random.Random(i).sample(near[i : i + 8], 8)
    assert evictions(turns, iter(near)) == want and want
    read = 0

    def stream():
        nonlocal read
        for b in events:
            read += 1
            yield b

    assert evictions([TurnBlocks(turn=1, start=2.0, ids=a, predicted=12)], stream()) == []
    assert read <= REORDER + 3  # the turn needed the batches before t=2 only: a window past them, not the file


def test_bad_kv_endpoints_are_one_line(tmp_path):
    assert subscriber_endpoint("127.0.0.1:5557") == "tcp://127.0.0.1:5557"
    assert subscriber_endpoint("tcp://*:5557") == "tcp://127.0.0.1:5557"
    with pytest.raises(InputError, match="must name a port"):
        subscriber_endpoint("tcp://host")
    r = run_proxy("--upstream", "http://127.0.0.1:9", "--out", str(tmp_path / "s"), "--kv-events", "udp://x:1")
    assert r.returncode == 2 and "--kv-events must be a tcp://" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("unreadable_first", [False, True])
def test_the_report_names_an_eviction_instead_of_a_content_break(tmp_path, unreadable_first):
    """A vLLM capture (prompt IDs as the bundled Qwen3 tokenizer renders the requests) and the events
    vLLM would have published: turn 3 resends turn 1, whose tail blocks turn 2 pushed out. A record the
    analysis leaves out (an ID outside the vocabulary) before them costs that record only: each turn keeps
    its own record's IDs and time (it took the record before it's, and the eviction went unnamed)."""
    from tokendiff.app.pair import PromptOptions, open_loader
    from tokendiff.sources.record import CaptureRecord

    loader = open_loader(PromptOptions())
    words = " ".join(f"alpha{i}" for i in range(60))
    a = {"messages": [{"role": "user", "content": f"A: {words}"}], "model": "m"}
    b = {"messages": [{"role": "user", "content": "B: " + " ".join(f"beta{i}" for i in range(60))}], "model": "m"}
    ids = [loader.rendered_ids(CaptureRecord(inline_request=r)).tolist() for r in (a, b, a)]
    size = 16
    blocks = len(ids[0]) // size
    hashes = [f"a{k}" for k in range(blocks)]
    predicted = (len(ids[0]) - 1) // size * size
    records, t0 = [], 1_800_000_000.0
    for k, (req, pids) in enumerate(zip((a, b, a), ids, strict=True), 1):
        cached = [0, 0, predicted - 2 * size][k - 1]
        records.append(
            {
                "schema": "tokendiff.capture/1",
                "seq": k,
                "ts": t0 + 10 * k + 1,
                "source": "proxy",
                "endpoint": "/v1/chat/completions",
                "request": req,
                "server": {"kind": "vllm", "block_size": size},
                "response": {
                    "status": 200,
                    "usage": {
                        "prompt_tokens": len(pids),
                        "completion_tokens": 1,
                        "prompt_tokens_details": {"cached_tokens": cached},
                    },
                },
                "ttft_ms": 900.0,
                "total_ms": 1000.0,
                "prompt_ids": pids,
            }
        )
    if unreadable_first:
        records.insert(0, {**records[0], "seq": 0, "ts": t0 + 5, "prompt_ids": [10**9]})
    (tmp_path / "capture.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    events = [
        {
            "ts": t0 + 10.5,
            "seq": 0,
            "topic": "",
            "rank": 0,
            "events": [
                {
                    "type": "BlockStored",
                    "block_hashes": hashes,
                    "parent_block_hash": None,
                    "token_ids": ids[0][: blocks * size],
                    "block_size": size,
                    "medium": "GPU",
                }
            ],
        },
        {
            "ts": t0 + 20.5,
            "seq": 1,
            "topic": "",
            "rank": 0,
            "events": [{"type": "BlockRemoved", "block_hashes": hashes[-2:], "medium": "GPU"}],
        },
    ]
    (tmp_path / "kv-events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    r = subprocess.run(
        [sys.executable, "-m", "tokendiff", "report", str(tmp_path), "--format", "json"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    t3 = doc["turns"][2]
    evicted = predicted - (blocks - 2) * size  # from the first block gone to the end of what was reusable
    assert t3["cause"] == EVICTED and t3["wasted"] >= evicted
    assert "per its KV events" in t3["note"] and "blocks evicted (KV cache full)" not in t3["note"]
    fact = next(f for f in doc["backend_facts"] if f["kind"] == EVICTED)
    assert fact["turn"] == 3 and f"block {blocks - 1} of the prompt" in fact["evidence"]
    span = next(sp for sp in doc["spans"] if sp["kind"] == EVICTED)
    assert span["section"] == "(the server)" and span["tokens"] == evicted and span["turns"] == [3]
    assert [t["cause"] for t in doc["turns"][:2]] != [EVICTED, EVICTED]
    r = subprocess.run([sys.executable, "-m", "tokendiff", "report", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0 and "vLLM evicted cached blocks this turn needed" in r.stdout


def test_the_recorder_refuses_a_message_past_its_bound(tmp_path, monkeypatch, publisher):
    """A publisher's message past MAX_MESSAGE is dropped by ZMQ (it was read whole, however large: a hostile
    peer's one message could take all memory); the recorder records on once the publisher is back."""
    from tokendiff.backends import kv_events

    monkeypatch.setattr(kv_events, "MAX_MESSAGE", 1 << 16, raising=False)
    pub, port = publisher
    out = tmp_path / "kv-events.jsonl"
    rec = KvEventRecorder(f"tcp://127.0.0.1:{port}", out).start()
    try:
        assert rec._sock.getsockopt(zmq.MAXMSGSIZE) == 1 << 16
        for seq in range(20):  # past the bound: each drops the connection (the recorder connects again)
            pub.send_multipart(message(1.0, [stored([seq], None, list(range(1 << 15)), 1 << 15)], seq=seq))
            time.sleep(0.05)
        _send_until(rec, pub, 2, lambda k: [message(2.0, [stored([k], None, [1, 2, 3, 4])], seq=k)], seq=20)
    finally:
        rec.stop()
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) >= 2 and all(x["ts"] == 2.0 for x in lines) and rec.dropped >= 1


def test_the_recorder_says_when_it_cannot_connect_again(tmp_path, monkeypatch, publisher):
    """The publisher dropped and connecting again fails (ZMQ refuses the endpoint): the recording ends, said
    with what was kept (the recorder's thread ended without a word)."""
    pub, port = publisher
    out = tmp_path / "kv-events.jsonl"
    warned: list[str] = []
    with sink(lambda kind, msg: warned.append(msg)):
        rec = KvEventRecorder(f"tcp://127.0.0.1:{port}", out).start()
        try:
            _send_until(rec, pub, 1, lambda k: [message(1.0, [stored([k], None, [1, 2, 3, 4])], seq=k)])

            def refused(self, endpoint):  # an error ZMQ gives no real peer a way to cause on a connect
                raise zmq.ZMQError(errno.EINVAL)

            monkeypatch.setattr(zmq.Socket, "connect", refused)
            pub.close(linger=0)  # the publisher stops: the recorder connects again
            deadline = time.monotonic() + 30
            while rec._thread.is_alive() and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            rec.stop()
    assert not rec._thread.is_alive()
    assert any(
        w.startswith(f"--kv-events: tcp://127.0.0.1:{port}: Invalid argument: no KV events are recorded after the ")
        for w in warned
    ), warned
