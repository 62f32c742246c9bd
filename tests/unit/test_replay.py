"""What `tokendiff replay` concludes from its runs: noisy runs are repeated, their spread reported, and no
gain is stated that the measured figures contradict. The backend here is scripted (noise on demand is what
a real server cannot be made to produce); tests/live/test_replay.py measures a real llama-server."""

from __future__ import annotations

from itertools import cycle

from tokendiff.backends import replay as rp

A = list(range(1, 101))
B = A[:10] + list(range(1000, 1090))  # shares 10 tokens with A
FIXED = A[:90] + list(range(5000, 5010))  # the fix restores 90


class Scripted(rp.Backend):
    """A llama-server-like cache (the primed prefix is reused) whose prefill times come from a script:
    scenario name -> the times of its successive runs (repeated when the script runs out)."""

    def __init__(self, times: dict[str, list[float]]):
        self.url, self.notes, self._primed = "http://127.0.0.1:9", [], []
        self.times = {k: cycle(v) for k, v in times.items()}

    def reset(self) -> None:
        self._primed = []

    def prime(self, ids: list[int]) -> None:
        self._primed = list(ids)

    def timed(self, ids: list[int], use_cache: bool = True) -> rp.Timing:
        cached = 0
        if use_cache:
            while cached < min(len(self._primed), len(ids) - 1) and self._primed[cached] == ids[cached]:
                cached += 1
        name = "cold" if not use_cache else "fixed" if ids == FIXED else "ideal" if cached > 10 else "actual"
        ms = next(self.times[name])
        return rp.Timing(ms, ms + 5, cached, len(ids) - cached)


def replay(times: dict[str, list[float]], repeat: int = 3) -> tuple[dict[str, rp.Scenario], str, dict]:
    be = Scripted(times)
    plan = rp.Plan(A, B, 10, 90, fixed_b=FIXED, fixed_lcp=90)
    scen = rp.run_scenarios(be, plan, repeat)
    fix = {"applied": ["messages[0].content as in A (date)"], "not_applied": []}
    doc = rp.replay_document(be, plan, scen, {"a": "a", "b": "b"}, fix)
    return scen, rp.render_replay_text(doc), doc


def test_steady_runs_state_the_gain_once_measured():
    steady = {"cold": [2000, 2010, 1990], "actual": [1900, 1910, 1890], "ideal": [300, 310, 290], "fixed": [320]}
    scen, text, doc = replay(steady)
    assert all(len(s.runs) == 3 for s in scen.values())  # nothing to repeat
    assert doc["speedup"] and doc["speedup"] > 6 and not doc["doubts"]
    assert "6.3x faster" in text and "with the fix (messages[0].content as in A (date)): 320.0 ms instead of" in text


def test_noisy_runs_are_repeated_their_spread_said_and_no_contradicted_gain_stated():
    """The issue's replay: the "actual" run slower than the cold one, the fix slower than today, and a
    speedup stated all the same. Now the runs are repeated while they stay noisy, the text says how
    noisy, and neither a speedup nor the fix's gain is claimed."""
    noisy = {
        "cold": [2000, 1400, 2600],
        "actual": [2137, 2900, 1500],
        "ideal": [1300, 2400, 700],
        "fixed": [2636, 1200, 2900],
    }
    scen, text, doc = replay(noisy)
    assert all(len(s.runs) > 3 for s in scen.values())  # repeated while noisy
    assert doc["rounds"] > 3 and doc["doubts"]
    assert "x faster" not in text and "instead of" not in text
    assert doc["speedup"] is None and doc["cost_ms"] is None
    assert "noisy" in text and "ranged" in text
    assert "not measurably faster" in text


def test_a_lighter_scenario_slower_by_a_hair_says_times_that_differ():
    """A doubt names two times that differ: "2.93 against 2.91 ms", never "2.9 against 2.9 ms"."""
    close = {"cold": [3.5], "actual": [2.91], "ideal": [2.93], "fixed": [1.0]}
    _, _, doc = replay(close, repeat=1)
    said = [d for d in doc["doubts"] if "took longer" in d]
    assert said and all("2.93 against 2.91 ms" in d for d in said), doc["doubts"]


def test_a_small_separated_gain_is_not_one_times_faster():
    """Every ideal run 40 ms faster than every actual one (1,041 against 1,001 ms): "the divergence costs
    40.0 ms per turn; fixing it would make this turn 1.0x faster" said no gain beside one."""
    from tokendiff.core.rounding import times_text

    steady = {"cold": [2000, 2010, 1990], "actual": [1040, 1041, 1042], "ideal": [1000, 1001, 1002], "fixed": [1003]}
    _, text, doc = replay(steady)
    assert doc["speedup"] == 1.04 and "costs 40.0 ms per turn" in text
    assert "would make this turn 1.04x faster" in text and "1.0x" not in text
    assert (times_text(6.3), times_text(1.004), times_text(1.0), times_text(1.1)) == ("6.3", "1.01", "1.00", "1.1")
