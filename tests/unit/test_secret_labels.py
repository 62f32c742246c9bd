"""Every label and title passes the secrets policy where it is made (issue 28): a name the request chose
(a tool, a call, a role) that is a credential is [REDACTED] in labels, path documents and findings, while
the name the detectors compare stays whole; names without a credential are untouched."""

from __future__ import annotations

from tokendiff.core.causes import finding
from tokendiff.core.kinds import CauseKind, SectionKind
from tokendiff.core.model import Part, SectionPath
from tokendiff.core.secrets import mask
from tokendiff.report.diff import path_json
from tokendiff.report.redact import redacted_path

KEY = "sk_live_51HAbCdEfGhIjKlMnOpQrStUv"


def test_a_name_that_is_a_credential_is_masked_in_every_label():
    tools = Part(SectionKind.TOOLS, field="tools")
    paths = [
        SectionPath.of(tools, Part(SectionKind.TOOL, 0, KEY, "tools[0]"), Part(SectionKind.FIELD, None, "name")),
        SectionPath.of(Part(SectionKind.MESSAGE, 2, "assistant"), Part(SectionKind.TOOL_CALL, 0, KEY)),
        SectionPath.of(Part(SectionKind.MESSAGE, 1, KEY, "messages[1]")),
        SectionPath.of(Part(SectionKind.BOILERPLATE, None, KEY)),
    ]
    for path in paths:
        assert KEY[4:] not in path.label + str(path_json(path)) + redacted_path(path).label, path
        assert "[REDACTED]" in path.label and any(p.name == KEY for p in path)  # the name itself kept whole
    plain = SectionPath.of(tools, Part(SectionKind.TOOL, 0, "get_secret_value", "tools[0]"))
    assert plain.label == "tools › get_secret_value" and path_json(plain)[1]["name"] == "get_secret_value"


def test_findings_are_masked_where_they_are_made():
    f = finding(CauseKind.TOOL_SET, 0, f"tool set changed (+{KEY}, -{KEY}): 1 -> 1 tools")
    assert f.evidence == "tool set changed (+[REDACTED], -[REDACTED]): 1 -> 1 tools"


def test_a_credential_after_a_lone_hyphen_is_masked_but_not_inside_an_identifier():
    assert mask(f"${{KEY:-{KEY}}}") == "${KEY:-[REDACTED]}"
    assert mask(f"my-{KEY}") == f"my-{KEY}"
