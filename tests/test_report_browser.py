"""The report page in a real browser: Debian's Chromium driven by Playwright, headless and
offline. The page loads without console errors and without a request leaving it; filtering
changes the rows; sorting orders them; a problem opens its ranked plans and charts; a plan
opens its details; a screenshot goes to the test log (tests/artifacts/report.png).

Without Chromium (/usr/bin/chromium) or the playwright package the tests skip, except where
PARPLAN_BROWSER_TESTS=required (set by .ci/run): there a missing browser fails the run.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from solver.sweep.outcome import SolveSettings, solve_sweep_problem
from solver.sweep.problems import SweepProblem
from solver.sweep.report import write_report
from solver.sweep.report_fronts import FrontPoint, build_front

CHROMIUM = "/usr/bin/chromium"
# Playwright's own browser download cannot reach the internet: Debian's Chromium instead, with
# nothing in the background that would.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
PROBLEMS = [
    SweepProblem("llama3.2-1b", "dgx-h100", 8, 4096, 1024, "bf16"),
    SweepProblem("llama3.2-1b", "dgx-h100", 16, 4096, 1024, "bf16"),
    SweepProblem("llama3.2-1b", "mi300x", 8, 4096, 1024, "bf16"),
    SweepProblem("llama3.2-1b", "mi300x", 16, 4096, 1024, "bf16"),
    SweepProblem("llama3.1-8b", "dgx-h100", 16, 4096, 1024, "bf16"),
    SweepProblem("llama3.1-405b", "dgx-h100", 8, 4096, 1024, "bf16"),  # infeasible
]


# A front of no group, as another planner (serving) would pass it: its own section.
EXTRA_FRONT = build_front("tokens/s against time per output token", "ms per output token",
                          "tokens/s", "lower", "higher",
                          [FrontPoint("tp 1", 9.0, 1200.0, "tp 1"),
                           FrontPoint("tp 2", 6.0, 2000.0, "tp 2"),
                           FrontPoint("tp 2", 7.0, 1500.0, "tp 2, more copies")])


def _browser_missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed"
    try:
        import plotly  # noqa: F401
    except ImportError:
        return "plotly (the report extra) is not installed"
    if not (os.path.exists(CHROMIUM) or shutil.which("chromium")):
        return f"{CHROMIUM} is missing (apt-get install -y chromium)"
    return None


@pytest.fixture(scope="module")
def page_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    missing = _browser_missing()
    if missing is not None:
        if os.environ.get("PARPLAN_BROWSER_TESTS") == "required":
            pytest.fail(f"browser tests required here, but {missing}")
        pytest.skip(missing)
    directory = tmp_path_factory.mktemp("report-page")
    lines = [solve_sweep_problem(p, SolveSettings(top=3)) for p in PROBLEMS]
    write_report(lines, directory, fronts=[EXTRA_FRONT])
    return directory / "index.html"


@pytest.fixture(scope="module")
def browser(page_path: Path) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any, page_path: Path) -> Iterator[Any]:
    """The report opened; `page.problems` are the errors and requests it made."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    tab = context.new_page()
    errors: list[str] = []
    requests: list[str] = []
    tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    tab.on("pageerror", lambda e: errors.append(str(e)))
    tab.on("request", lambda r: requests.append(r.url) if not r.url.startswith(
        ("file://", "data:", "blob:", "about:")) else None)
    tab.goto(page_path.as_uri())
    tab.wait_for_selector("body[data-ready=true]", timeout=30_000)
    tab.errors, tab.requests = errors, requests
    yield tab
    context.close()


def _visible_rows(page: Any) -> list[list[str]]:
    return page.eval_on_selector_all(
        "#problems tbody tr:not([hidden])",
        "rows => rows.map(r => Array.from(r.cells, c => c.textContent))")


def _column(page: Any, label: str) -> int:
    labels = page.eval_on_selector_all("#problems thead th", "ths => ths.map(t => t.textContent)")
    return labels.index(label)


def test_loads_without_errors_or_requests(page: Any) -> None:
    assert page.errors == []
    assert page.requests == []  # Plotly runs from a blob of the page's own text
    # The table is drawn before Plotly's bundle runs, then the charts.
    table, charts = page.evaluate("['table-ready', 'charts-ready'].map("
                                  "n => performance.getEntriesByName(n)[0].startTime)")
    assert table <= charts
    assert len(_visible_rows(page)) == len(PROBLEMS)
    assert page.inner_text("#row-count") == f"{len(PROBLEMS)} of {len(PROBLEMS)} problems shown"
    # The first solved problem in key order is open, with its charts drawn by Plotly.
    assert page.inner_text("#details-title") == "llama3.1-8b on dgx-h100, 16 GPUs"
    # step parts, memory, and the fronts: tokens/s, GPU-hours and kWh (issue 42)
    assert page.locator("#details .js-plotly-plot").count() == 5
    # The extra front has a section of its own.
    assert page.inner_text("#fronts h2") == "Pareto fronts"
    assert page.locator("#fronts .main-svg").count() >= 1
    assert "tokens/s against time per output token" in page.inner_text("#fronts")


def test_filtering_changes_the_rows(page: Any) -> None:
    page.select_option("#filter-cluster", "mi300x")
    rows = _visible_rows(page)
    cluster = _column(page, "cluster")
    assert len(rows) == 2 and {r[cluster] for r in rows} == {"mi300x"}
    page.select_option("#filter-cluster", "")
    page.fill("#filter-text", "infeasible")
    rows = _visible_rows(page)
    assert len(rows) == 1 and "memory_fits_hbm" in " ".join(rows[0])
    assert page.inner_text("#row-count") == f"1 of {len(PROBLEMS)} problems shown"
    page.fill("#filter-text", "")
    page.select_option("#filter-gpus", "16")
    assert {r[_column(page, "GPUs")] for r in _visible_rows(page)} == {"16"}


def test_sorting_orders_the_rows(page: Any) -> None:
    page.click("#problems thead th:text-is('tokens/s')")
    rate = _column(page, "tokens/s")
    values = [r[rate] for r in _visible_rows(page)]
    numbers = [float(v.replace(",", "")) for v in values if v]
    assert numbers == sorted(numbers) and values[-1] == ""  # the infeasible one last
    page.click("#problems thead th:text-is('tokens/s')")
    numbers = [float(v.replace(",", "")) for v in (r[rate] for r in _visible_rows(page)) if v]
    assert numbers == sorted(numbers, reverse=True)


def test_a_problem_and_a_plan_open_their_details(page: Any, page_path: Path) -> None:
    page.locator("#problems tbody tr", has_text="mi300x").first.click()
    assert page.inner_text("#details-title") == "llama3.2-1b on mi300x, 8 GPUs"
    row = page.locator("#problems tbody tr", has_text="llama3.1-8b")
    row.click()
    assert page.inner_text("#details-title") == "llama3.1-8b on dgx-h100, 16 GPUs"
    assert row.get_attribute("class").endswith("selected")
    plans = page.locator("#details table.plans tr.plan")
    assert 1 <= plans.count() <= 3
    launch = plans.first.locator("td.launch code").inner_text()
    assert launch.startswith("parplan launch --model llama3.1-8b --cluster dgx-h100 --gpus 16")
    # Memory, step time and the two fronts are drawn.
    assert page.locator("#chart-memory .main-svg").count() >= 1
    assert page.locator("#chart-time .main-svg").count() >= 1
    assert page.locator("#details .front .main-svg").count() >= 2
    details = page.locator("#details tr.plan-details").first
    assert details.is_hidden()
    plans.first.locator("button.more").click()
    assert details.is_visible()
    assert "memory (worst stage)" in details.inner_text()
    assert "weights" in details.inner_text() and "compute" in details.inner_text()
    page.locator("#problems tbody tr", has_text="infeasible").click()
    assert "Why nothing fits" in page.inner_text("#details")
    assert "memory_fits_hbm" in page.inner_text("#details")
    assert page.errors == []
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#problems tbody tr", has_text="llama3.2-1b").first.click()
    page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
    print(f"screenshot: {ARTIFACTS / 'report.png'}")
    assert json.loads(page.evaluate("JSON.stringify(location.hash)")).startswith("#problem-")


# Every Plotly chart on the page: its series names and its axes as drawn.
CHARTS_JS = """() => Array.from(document.querySelectorAll('#details .js-plotly-plot'), div => ({
  id: div.id, names: div.data.map(t => t.name),
  axes: ['xaxis', 'yaxis'].map(a => ({type: div._fullLayout[a].type,
    rangemode: div._fullLayout[a].rangemode, range: div._fullLayout[a].range,
    title: (div._fullLayout[a].title || {}).text || ''}))}))"""


def test_every_series_is_named_and_every_axis_starts_at_zero_or_says_log(page: Any) -> None:
    """Issue 39 item 8: no series without a name (the offload part was "trace 4"); a linear
    axis of a value starts at zero (the GPU-hours axis was zoomed to a 0.01% range), a log
    axis says so; the memory chart shows "other" item by item and each plan's % of the GPU."""
    rows = page.locator("#problems tbody tr")
    for r in range(rows.count()):
        rows.nth(r).click()
        for chart in page.evaluate(CHARTS_JS):
            assert all(name and not name.startswith("trace ") for name in chart["names"]), chart
            for axis in chart["axes"]:
                if axis["type"] == "log":
                    assert "(log scale)" in axis["title"], chart
                elif axis["type"] == "linear":
                    assert axis["rangemode"] == "tozero" and axis["range"][0] <= 0, chart
            if chart["id"] == "chart-memory":
                assert any(name.startswith("other: ") for name in chart["names"]), chart
                assert "% of GPU memory" in chart["names"]
    assert page.errors == []


def test_launch_lines_break_at_spaces_only(page: Any) -> None:
    """Issue 39 item 8: a launch line wraps between words, never inside one, and has its copy
    button; the plans table shows each plan's % of GPU memory."""
    page.locator("#problems tbody tr", has_text="llama3.1-8b").click()
    code = page.locator("#details td.launch code").first
    # The character before each line break, over every text node of the line.
    breaks = code.evaluate("""el => {
      const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
      const range = document.createRange(), after = [];
      let top = null, previous = null;
      for (let text = walker.nextNode(); text; text = walker.nextNode()) {
        for (let i = 0; i < text.length; i++) {
          range.setStart(text, i); range.setEnd(text, i + 1);
          const rects = range.getClientRects();
          if (!rects.length) { previous = text.data[i]; continue; }
          if (top !== null && rects[0].top > top + 1) after.push(previous);
          top = rects[0].top; previous = text.data[i];
        }
      }
      return after;
    }""")
    assert code.inner_text().startswith("parplan launch --model llama3.1-8b ")
    assert breaks and set(breaks) == {" "}  # it wraps, and only at spaces
    assert page.locator("#details td.launch button.copy").count() == \
        page.locator("#details tr.plan").count()
    header = page.eval_on_selector_all("#details table.plans th", "t => t.map(x => x.textContent)")
    memory = header.index("GB per GPU (% of GPU memory)")
    cell = page.locator("#details tr.plan").first.locator("td").nth(memory).inner_text()
    assert cell.endswith("%)") and " of " in cell
