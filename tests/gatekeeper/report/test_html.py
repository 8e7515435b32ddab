"""The details page (gatekeeper/report/html.py): what it shows, that PR-controlled text stays text, and (marker
`browser`) that a real headless Chromium loads it offline without a console error."""

from __future__ import annotations

import html
import re

import pytest
from gatekeeper.report.html import CONTENT_SECURITY_POLICY, floor_distance, heatmap, render_html, speedup_colour


def _cells(page: str) -> list[str]:
    return re.findall(r'<g class="cell[^"]*" data-row="(\d+)"', page)


def test_one_heatmap_cell_per_perf_row_and_missing_rows_are_holes(page_verdict):
    page = render_html(page_verdict)
    rows = page_verdict.checks[3].details["rows"]
    assert _cells(page) == [str(i) for i in range(len(rows))]
    assert re.findall(r'<g class="cell missing" data-row="(\d+)"', page) == ["5", "30"]
    assert re.findall(r'<g class="cell problem" data-row="(\d+)"', page) == ["12"]


def test_the_heatmap_runs_the_axis_with_most_values_across_and_names_constant_axes_once(page_verdict):
    details = page_verdict.checks[3].details
    grid = heatmap(details)
    layers = tuple(dict.fromkeys(row["axes"]["layer"] for row in details["rows"]))  # the matrix's own order
    assert layers[:3] == ("kda_moe", "mla_moe", "moe")
    assert [text for _, text in grid.column_heads] == [f"batch={b}" for b in (1, 2, 4, 8, 16, 32, 64)]
    assert [text for _, text in grid.row_heads] == [f"tp={tp}, layer={layer}" for layer in layers for tp in (8, 16)]
    measured_context = {"context": 4096} if "context" in details["rows"][0]["axes"] else {}
    assert grid.constant == {"arch": "sm_90", "dcp": 1, "spec": "none", **measured_context}
    assert len({(c.x, c.y) for c in grid.cells}) == len(grid.cells)  # no two rows share a cell


def test_a_cell_says_its_numbers_on_hover():
    row = {"axes": {"tp": 8}, "unit": "us", "baseline": 200.0, "candidate": 100.0, "speedup": 2.0, "floor": 50.0,
           "runs": 20, "spread_pct": 0.5, "source": "gatekeeper collect (trusted)", "problems": []}
    [cell] = heatmap({"axes": {"tp": [8]}, "rows": [row]}).cells
    assert cell.speedup_text == "2.00×" and cell.floor_text == "2.00× floor"
    assert "candidate 100 us, baseline 200 us" in cell.title and "byte floor 50 us: 2× away" in cell.title
    assert floor_distance({**row, "unit": "tokens/s", "candidate": 25.0}) == 2.0  # a rate: floor over candidate
    assert speedup_colour(1.0) == "#ffffff" and speedup_colour(4.0) == speedup_colour(2.0)  # clipped at 2x


def test_changed_lines_are_coloured_with_their_tests_in_the_title(page_verdict):
    page = render_html(page_verdict)
    covered = re.search(r'<span class="ln mono covered" title="([^"]*)">40</span>', page)
    assert covered is not None
    assert html.unescape(covered.group(1)) == ("line 40 ran under 2 passing tests:\n"
                                               "tests/kimi_k3_path/test_moe.py::test_decode[tp8]\n"
                                               "tests/kimi_k3_path/test_moe.py::test_router")
    assert re.search(r'<span class="ln mono uncovered" title="line 44: no passing test ran it">44</span>', page)
    assert re.findall(r'<span class="ln mono (\w+)" title="[^"]*">([\d–]+)</span>', page) == [
        ("covered", "40"), ("covered", "41"), ("covered", "42"), ("covered", "43"), ("uncovered", "44"),
        ("covered", "45–46"), ("excluded", "47")]
    assert 'class="ln mono excluded"' in page and "not measured: no test run measured this file" in page


def _hostile(verdict) -> str:
    return verdict.signals[1].detail  # the fixture's hostile label: markup and a bidi override


def test_pr_controlled_text_cannot_inject_markup(page_verdict):
    page = render_html(page_verdict, subject=f"o/r#1 at {_hostile(page_verdict)}")
    assert "<script" not in page and "<img" not in page and "onerror=alert(1)>" not in page
    assert "&lt;script&gt;" in page and "\\u{202E}" in page and "\u202e" not in page  # bidi shown, not applied
    assert f'http-equiv="Content-Security-Policy" content="{html.escape(CONTENT_SECURITY_POLICY)}"' in \
        page.replace("&#39;", "&#x27;")  # no script may run, nothing may be fetched, whatever got in


def test_blast_radius_is_shown_only_when_the_verdict_has_one(page_verdict):
    from gatekeeper.verdict import BlastRadius

    assert "Blast radius" not in render_html(page_verdict)
    radius = BlastRadius(package="kimi_k3/nvidia", statement="Kimi K3 on sm_90, TP 8 or 16 <b>", change="widens",
                         widened={"tp": (4,)}, newly_accepted_probes=("tp4",))
    page = render_html(page_verdict.model_copy(update={"blast_radius": (radius,)}))
    assert 'id="blast-radius"' in page and "kimi_k3/nvidia" in page and "widens what the guard admits" in page
    assert "newly admitted tp: 4" in page and "accepted now: tp4" in page and "&lt;b&gt;" in page


@pytest.mark.browser
def test_the_page_loads_offline_in_chromium_with_one_cell_per_row(page_verdict, browser_page, artifacts_dir, tmp_path):
    page, errors = browser_page
    path = tmp_path / "report.html"
    path.write_text(render_html(page_verdict, subject="Codertocat/Hello-World#2 at 1a2b3c4d5e6f"), encoding="utf-8")
    page.goto(path.as_uri())
    rows = page_verdict.checks[3].details["rows"]
    assert page.locator("svg.heatmap g.cell").count() == len(rows)
    assert page.locator("svg.heatmap g.cell.missing").count() == 2
    assert page.locator("#rule-changed_path_tests .file .ln.covered").count() == 5
    # The hostile label is text on the page, not an element.
    assert page.locator("img").count() == 0 and page.locator("script").count() == 0
    assert _hostile(page_verdict).replace("\u202e", "\\u{202E}") in page.locator("#signals").inner_text()
    page.screenshot(path=str(artifacts_dir / "details-page.png"), full_page=True)
    assert errors == []


def test_a_verdict_read_back_from_the_json_report_renders_as_the_verdict_does(page_verdict):
    """`gatekeeper check --format json` adds each check's Markdown table to its details: not shown again."""
    import json

    from gatekeeper.report.json_report import render_json
    from gatekeeper.verdict import Verdict

    raw = json.loads(render_json(page_verdict))
    assert "markdown" in raw["checks"][3]["details"]
    page = render_html(Verdict.model_validate(raw), raw=raw)
    assert page == render_html(page_verdict)


def test_a_verdict_from_before_the_per_line_data_still_renders(page_verdict):
    checks = list(page_verdict.checks)
    files = [{k: v for k, v in f.items() if k not in ("statements", "excluded")}
             for f in checks[2].details["files"]]
    checks[2] = checks[2].model_copy(update={"details": {"files": files}})
    page = render_html(page_verdict.model_copy(update={"checks": tuple(checks)}))
    assert "Uncovered: 44 (this verdict predates per-line data)." in page and 'class="ln mono covered"' not in page
