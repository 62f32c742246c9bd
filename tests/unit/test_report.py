"""The report's wording in process: headlines that agree with the figures, titles that read inside a
sentence, and a cause seen only behind another break named without a row of zeros."""

from __future__ import annotations

from prompts import CONVERSATION, TOOLS, prompt_from_ids, qwen_encode, render


def test_a_span_only_seen_behind_another_break_is_no_row_of_zeros(vocab):
    """A date and a counter change in one system prompt: the date breaks the cache first, so the counter costs
    nothing of its own. md and html name it in one line instead of a 0-token row of the ranked table."""
    from tokendiff.core.cost import analyse
    from tokendiff.report.html import render_html
    from tokendiff.report.markdown import render_markdown
    from tokendiff.report.session import report_document

    def prompt(day, left):
        sys = {
            "role": "system",
            "content": f"Date: 2026-11-{day}\n" + "Be terse and careful. " * 30 + f"\n{left}% left",
        }
        return prompt_from_ids(qwen_encode(render("Qwen-Qwen3-0.6B.jinja", [sys, *CONVERSATION[1:2]], TOOLS)), vocab)

    prompts = [prompt(28, 40), prompt(29, 35)]
    doc = report_document("pair", prompts, analyse(prompts), {"name": "qwen3"})
    assert [(sp["kind"], sp["tokens"]) for sp in doc["spans"]] == [("date", doc["turns"][1]["wasted"]), ("counter", 0)]
    md = render_markdown(doc)
    assert "| 2 | A counter" not in md
    assert "Also changed, but only after an earlier break in the same turn (no tokens of their own): " in md
    assert "A counter or percentage changed in `system prompt` (turn 2)" in md
    html = render_html(doc)
    assert "A counter or percentage changed in <code>system prompt</code> (turn 2)" in html


def test_headlines_without_a_costly_cause_agree_with_the_wasted_count():
    from tokendiff.report.session import quiet_headline

    assert quiet_headline(80, 100, 0).startswith("No waste: ")
    some = quiet_headline(80, 100, 5)
    assert "No waste" not in some and "5 tokens were recomputed" in some
    assert quiet_headline(80, 100, 0, where=" in 3 sessions").startswith("No waste in 3 sessions: ")


def test_titles_read_inside_a_sentence():
    from tokendiff.report.session import in_sentence

    assert in_sentence("JSON re-serialised (same value, different text)").startswith("JSON re-")
    assert in_sentence("Date or time in the prompt changed") == "date or time in the prompt changed"


def test_a_headline_names_the_section_once():
    from tokendiff.core.cost import Session, Span
    from tokendiff.core.model import Part, SectionPath
    from tokendiff.report.session import headline

    system = SectionPath.of(Part("message", 0, "system"))
    span = Span("system_appended", system, "Text inserted at the end of the system prompt", "", [2], 10, share=1.0)
    text = headline(Session([], [span], None, 100, 50, 10))
    assert text.startswith("Fix this first: text inserted at the end of the system prompt. ")
    span = Span("date", system, "Date or time in the prompt changed", "", [2], 10, share=1.0)
    assert "changed in system prompt. " in headline(Session([], [span], None, 100, 50, 10))


def test_one_rounding_rule_for_every_view(agent_session):
    """Turn 4 of the agent session reuses 1,617 of 1,772 tokens: 91.2528... %. Every view says 91.3 (the
    markdown said 91.2 from a stored, pre-rounded 91.25 rounded again half to even), the JSON keeps
    91.25 (two places, half up from the counts), and a tie rounds up everywhere."""
    from tokendiff.core.rounding import percent, percent_text
    from tokendiff.report.html import render_html
    from tokendiff.report.markdown import render_markdown
    from tokendiff.report.session import report_document
    from tokendiff.tui.widgets.session_view import COLUMNS

    s = agent_session.session
    t4 = s.turns[3]
    assert (t4.reuse["llama.cpp"], t4.n_tokens) == (1_617, 1_772)
    doc = report_document("agent", agent_session.prompts, s, {"name": "qwen3"})
    assert doc["turns"][3]["reuse_pct"] == 91.25
    assert "| 4 | 1,772 | 1,617 | 91.3 |" in render_markdown(doc)
    assert "<td class=n>91.3</td>" in render_html(doc) and "91.3 % reused" in render_html(doc)
    reuse_col = next(c for c in COLUMNS if c.title == "reuse %")
    assert reuse_col.cell(t4) == "91.3"
    assert percent(1, 8, 0) == 13.0 and percent_text(1, 8, 0) == "13" and percent_text(3, 8, 1) == "37.5"
    assert percent(1, 40, 1) == 2.5 and percent_text(1, 80, 1) == "1.3" and percent(0, 0) == 100.0


def test_an_excerpt_marks_whole_characters_where_a_token_ends_inside_one():
    """Llama 3's byte-level BPE splits an emoji's skin tone modifier (4 bytes) between two tokens: the
    divergent token holds its last bytes only. Marked as they are, both sides read '👋�⟦�⟧' and hide the
    change; the marks go around the whole character instead."""
    from prompts import real_tokenizer

    from tokendiff.core.align import align
    from tokendiff.report.excerpt import excerpt

    tk = real_tokenizer("llama3")
    a, b = (tk.prompt(f"<|start_header_id|>user<|end_header_id|>\n\nHello 👋{tone} there") for tone in "🏽🏿")
    h = align(a, b).hunks[0]
    assert a.data[h.a_byte_start : h.a_byte_start + 1] != "🏽".encode()[:1]  # the token starts inside it
    ea, eb = excerpt(a, h.a_start, h.a_end, 3), excerpt(b, h.b_start, h.b_end, 3)
    assert (ea.diverged, eb.diverged) == ("🏽", "🏿")
    assert "\ufffd" not in ea.before + ea.after + eb.before + eb.after


def test_a_count_of_one_is_singular_in_the_report_lines():
    """ "1 tokens were recomputed" and "wasted 1 tokens" read wrong: a count of one takes the singular."""
    from tokendiff.core.rounding import counted
    from tokendiff.report.session import quiet_headline

    assert (
        counted(1, "token") == "1 token"
        and counted(1024, "token") == "1,024 tokens"
        and counted(0, "turn") == "0 turns"
    )
    assert quiet_headline(9, 10, 1).startswith("No cause to fix: 1 token was recomputed where")
    assert quiet_headline(8, 10, 2).startswith("No cause to fix: 2 tokens were recomputed where")


def test_a_session_of_one_turn_says_one_turn(vocab):
    """A directory whose other turns could not be read leaves one: '1 turns' was printed."""
    from tokendiff.core.cost import analyse
    from tokendiff.report.html import render_html
    from tokendiff.report.markdown import render_markdown
    from tokendiff.report.session import report_document

    prompts = [prompt_from_ids(qwen_encode(render("Qwen-Qwen3-0.6B.jinja", CONVERSATION[:2], TOOLS)), vocab)]
    doc = report_document("one", prompts, analyse(prompts), {"name": "qwen3"})
    assert "- 1 turn, " in render_markdown(doc) and "<p>1 turn, " in render_html(doc)


def test_a_part_strictly_between_none_and_all_never_reads_0_or_100():
    """9,996 of 10,000 tokens reused read "100.0" (and 99.996 % "100.00" in the JSON), 4 of 10,000 "0.0", a
    span of 10,002 of 10,004 wasted tokens "100 % of the waste", a 0.4 ms prefill "0" ms and 4.8 ms "0.00" s:
    each is the nearest figure that is not 0 or 100 (or "<1", "<0.01"), and every exact figure stays."""
    from tokendiff.core.rounding import percent, percent_text, seconds_text, stated_percent_text, whole_text

    assert percent_text(9_996, 10_000) == "99.9" and percent(99_996, 100_000, 2) == 99.99
    assert percent_text(4, 10_000) == "0.1" and percent(4, 1_000_000, 2) == 0.01
    assert percent_text(10_002, 10_004, 0) == "99" and percent_text(1, 1_000, 0) == "1"
    assert percent_text(10_000, 10_000) == "100.0" and percent_text(0, 10_000) == "0.0" and percent(0, 0) == 100.0
    assert percent_text(1, 8, 0) == "13" and percent_text(9_995, 10_000) == "99.9"  # 99.95: half up would say 100.0
    assert seconds_text(0.0004) == "<0.01" and seconds_text(0) == "0.00" and seconds_text(0.005) == "0.01"
    assert seconds_text(10_800.0) == "10,800.0"
    assert whole_text(0.4) == "<1" and whole_text(0) == "0" and whole_text(0.5) == "1"
    assert whole_text(10_800_000) == "10,800,000"
    assert stated_percent_text(99.99) == "99" and stated_percent_text(0.01, 1) == "0.1"
    assert stated_percent_text(100.0) == "100" and stated_percent_text(12.5) == "13" and stated_percent_text(0.0) == "0"
    from tokendiff.report.cloud import money

    assert money(0.0000036) == "<$0.0001" and money(0.0) == "$0.0000" and money(12_345.67) == "$12,345.67"
