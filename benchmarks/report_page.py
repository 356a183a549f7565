"""How the report page holds up with the whole zoo: its size, and how fast Chromium loads it,
filters and sorts its table and opens a problem (charts drawn).

    parplan sweep --models all --clusters dgx-h100,dgx-a100-80gb,mi300x,gb200-nvl72 \\
        --gpus 8,64,256,1024,4096 -o zoo.jsonl        # 38 models x 4 clusters x 5 scales
    python benchmarks/report_page.py zoo.jsonl

Needs the report extra (plotly), the playwright package and Debian's Chromium
(/usr/bin/chromium). Prints one table; times are the median of --repeat page loads, each in a
fresh tab, measured inside the page (performance marks and performance.now()). The page draws
its table first and runs Plotly's bundle after, so the two load rows differ.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from solver.sweep.report import write_report
from solver.sweep.results import read_results

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def _timed(page, action, ready: str) -> float:
    """Milliseconds from `action` to the page satisfying the JS expression `ready`."""
    start = page.evaluate("performance.now()")
    action()
    page.wait_for_function(ready)
    return page.evaluate("performance.now()") - start


def measure(path: Path, repeat: int) -> dict[str, list[float]]:
    from playwright.sync_api import sync_playwright

    times: dict[str, list[float]] = {"load: table drawn (sort, filter, open a problem)": [],
                                     "load: Plotly run, first problem's charts drawn": [],
                                     "filter by text": [], "sort by tokens/s": [],
                                     "open a problem (plans, 4 charts)": []}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        for _ in range(repeat):
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(path.as_uri())
            page.wait_for_selector("body[data-ready=true]", timeout=120_000)
            marks = page.evaluate("['table-ready', 'charts-ready'].map("
                                  "n => performance.getEntriesByName(n)[0].startTime)")
            times["load: table drawn (sort, filter, open a problem)"].append(marks[0])
            times["load: Plotly run, first problem's charts drawn"].append(marks[1])
            times["filter by text"].append(_timed(
                page, lambda: page.fill("#filter-text", "llama h100"),
                "document.getElementById('row-count').textContent.startsWith('') && "
                "document.querySelectorAll('#problems tbody tr:not([hidden])').length < "
                "document.querySelectorAll('#problems tbody tr').length"))
            page.fill("#filter-text", "")
            times["sort by tokens/s"].append(_timed(
                page, lambda: page.click("#problems thead th:text-is('tokens/s')"),
                "document.querySelector('#problems thead th[aria-sort=ascending]') !== null"))
            rows = page.locator("#problems tbody tr.status-optimal")
            target = rows.nth(rows.count() // 2)
            index = target.get_attribute("data-index")
            times["open a problem (plans, 4 charts)"].append(_timed(
                page, target.click,
                f"location.hash === '#problem-{index}' && "
                "document.querySelectorAll('#details .main-svg').length >= 4"))
            page.close()
        browser.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="a sweep's results file")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    lines, _ = read_results(args.results)
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        answer = write_report(lines, folder)
        written_s = time.perf_counter() - start
        page = Path(folder) / "index.html"
        html = page.read_text(encoding="utf-8")
        data_start = html.index('id="report-data">')
        data_bytes = html.index("</script>", data_start) - data_start
        problems = sum(answer.status_counts.values())
        plans = sum(len(line.get("plans") or []) for line in lines)
        print(f"{problems} problems ({', '.join(f'{n} {s}' for s, n in answer.status_counts.items())}), "
              f"{plans} plans; report written in {written_s:.1f} s")
        print(f"page {page.stat().st_size / 1e6:.1f} MB: data {data_bytes / 1e6:.1f} MB, "
              f"the rest Plotly's bundle, the script and the style")
        times = measure(page, args.repeat)
    print(f"\n| step | median ms | runs (ms) |\n| --- | ---: | --- |")
    for name, values in times.items():
        runs = ", ".join(f"{v:.0f}" for v in values)
        print(f"| {name} | {statistics.median(values):.0f} | {runs} |")


if __name__ == "__main__":
    sys.exit(main())
