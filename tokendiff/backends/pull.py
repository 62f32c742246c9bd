"""`tokendiff pull`: save a live llama-server's slots into a session directory.

Each slot that holds a prompt is saved with `POST /slots/N?action=save`
(the server writes it into its `--slot-save-path`), copied into the session
directory with its save time kept (turn order is save order), and the
server's `/props`, `/v1/models` and `/slots` answers are written beside it.
With `every`, it keeps polling and saves a slot again whenever its prompt
changed, so a running agent's turns are collected as it goes.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import orjson

from tokendiff.backends.server import LLAMA, SLOT_TIMEOUT, LlamaClient, probe
from tokendiff.errors import InputError, ServerError
from tokendiff.sources.slotfile import read_slot_file


@dataclass
class Puller:
    server: str
    out: Path
    slot_dir: Path
    api: LlamaClient = field(init=False)
    seen: dict[int, tuple[int | None, int]] = field(default_factory=dict)  # slot -> (id_task, n_prompt_tokens) saved
    n_slots: int = 1

    def __post_init__(self) -> None:
        self.server = self.server.rstrip("/")
        self.api = LlamaClient(self.server, timeout=SLOT_TIMEOUT)

    def start(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        info = probe(self.server, LLAMA, self.api.http)
        self._write("props.json", info.props)
        if info.models is not None:
            self._write("models.json", info.models)
        self.n_slots = info.total_slots

    def _write(self, name: str, doc: Any) -> None:
        (self.out / name).write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))

    def poll(self) -> list[Path]:
        """Save every slot whose prompt changed since the last save; return the new files."""
        states, raw = self.api.slots()
        self._write("slots.json", raw)
        saved = []
        for s in states:
            if not s.holds_prompt:  # never used: nothing cached
                continue
            key = (s.id_task, s.n_prompt_tokens)
            if self.seen.get(s.id) == key and not s.is_processing:
                continue
            f = self._save(s.id)
            if f is not None:
                self.seen[s.id] = key
                saved.append(f)
        return saved

    def _save(self, slot: int) -> Path | None:
        name = f"tokendiff-pull-{os.getpid()}-{slot}.bin"
        try:
            self.api.save_slot(slot, name)
        except InputError as e:
            if "--slot-save-path" in str(e):
                raise ServerError(
                    f"{e}; restart it with --slot-save-path DIR and pass the same DIR as --slot-dir", source=self.server
                ) from None
            raise
        src = self.slot_dir / name
        if not src.is_file():
            raise InputError(
                f"the server saved slot {slot} as {name}, but it is not in --slot-dir {self.slot_dir}; "
                "pass the server's --slot-save-path",
                source=self.server,
            )
        return self._keep(slot, src)

    def _keep(self, slot: int, src: Path) -> Path | None:
        """Move a saved slot file into the session as the next turn, unless nothing changed."""
        dest_dir = self.out if self.n_slots == 1 else self.out / f"slot-{slot}"
        dest_dir.mkdir(parents=True, exist_ok=True)
        turn, latest = last_turn(dest_dir)
        if latest is not None and _same_tokens(latest, src):  # nothing new since the last pull
            src.unlink(missing_ok=True)
            return None
        dest = dest_dir / f"turn-{turn + 1:04d}.bin"
        shutil.copy2(src, dest)
        src.unlink(missing_ok=True)
        return dest


def last_turn(session: Path) -> tuple[int, Path | None]:
    """The highest N of the session's turn-N.bin files, and that file (0, None: none yet). By number, not by name:
    past turn 9,999 the names outgrow the padding, and "turn-10000.bin" sorts before "turn-9999.bin" as text."""
    best: tuple[int, Path | None] = (0, None)
    for f in session.glob("turn-*.bin"):
        n = f.stem.removeprefix("turn-")
        if n.isascii() and n.isdigit() and int(n) > best[0]:
            best = (int(n), f)
    return best


def _same_tokens(a: Path, b: Path) -> bool:
    try:
        return np.array_equal(read_slot_file(a).tokens, read_slot_file(b).tokens)
    except InputError:
        return False


def pull(server: str, out: str, slot_dir: str, every: float | None = None, log: TextIO = sys.stderr) -> int:
    sd = Path(slot_dir)
    if not sd.is_dir():
        raise InputError("--slot-dir is not a directory (it must be the server's --slot-save-path)", source=slot_dir)
    p = Puller(server, Path(out), sd)
    p.start()
    total = 0
    try:
        while True:
            for f in p.poll():
                total += 1
                print(f"saved {f}", file=log)
            if every is None:
                break
            time.sleep(every)
    except KeyboardInterrupt:
        pass
    if total == 0 and every is None:
        print("tokendiff: no slot holds a prompt yet; nothing saved", file=log)
    return 0
