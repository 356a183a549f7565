"""`parplan report`: a sweep's results file as tables and one interactive HTML page."""

from __future__ import annotations

import click

from solver.cli.options import TokenCount


@click.command()
@click.argument("results", metavar="RESULTS.jsonl", type=click.Path(dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False),
              help="Folder for summary.csv, summary.md and index.html.")
@click.option("--token-budget", type=TokenCount(), default="1T", show_default=True,
              help="Tokens to train on: the days and GPU-hours of every plan.")
@click.option("--no-charts", "--no-plots", "no_charts", is_flag=True,
              help="A page without Plotly's charts (about 5 MB smaller).")
def report(results: str, output: str, token_budget: int, no_charts: bool) -> None:
    """A self-contained page (index.html, works offline): every problem in a sortable,
    filterable table; per problem the ranked plans with their launch lines, memory against
    the GPU's capacity and step time by part; per model and job the Pareto fronts (tokens/s
    against GPUs, GPU-hours against days). Also summary.csv and summary.md."""
    from solver.sweep.report import write_report
    from solver.sweep.results import read_results

    lines, torn = read_results(results)
    if torn:
        click.echo(f"{results}: skipped an incomplete last line (a sweep still writing, or "
                   "killed: rerun it to redo that problem)", err=True)
    answer = write_report(lines, output, charts=not no_charts, token_budget=token_budget)
    counts = ", ".join(f"{n} {status}" for status, n in answer.status_counts.items())
    page = answer.directory / "index.html"
    click.echo(f"{page}: {sum(answer.status_counts.values())} problems ({counts or 'none'}), "
               f"{page.stat().st_size / 1e6:.1f} MB; tables summary.csv, summary.md")
    if answer.charts_skipped is not None and not no_charts:
        click.echo(f"no charts: {answer.charts_skipped}")
