"""The doctor workflow: a live server's configuration checked for an agent workload (tokendiff.backends.doctor
gathers the evidence and judges it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tokendiff.backends.doctor import Workload, render_text
from tokendiff.backends.doctor import doctor as check_server

if TYPE_CHECKING:
    from tokendiff.backends.doctor import DoctorReport


# ---------------------------------------------------------------- doctor


@dataclass(frozen=True)
class DoctorOptions:
    server: str
    agents: int = 1
    prompt_tokens: int = 32768
    turn_tokens: int = 256  # what a turn adds (vLLM's block size is judged against it)
    passive: bool = False  # read and render only: no probe completion on the server


def doctor(opts: DoctorOptions) -> DoctorReport:
    """Pre-flight check of a live server for an agent workload (exit_code: 0 all clear, 1 problems)."""
    workload = Workload(
        agents=opts.agents, prompt_tokens=opts.prompt_tokens, turn_tokens=opts.turn_tokens, probe_cache=not opts.passive
    )
    return check_server(opts.server, workload)


def doctor_text(report: DoctorReport) -> str:
    """The report as `tokendiff doctor` prints it: one line per check, problems first."""
    return render_text(report)
