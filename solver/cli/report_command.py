"""`parplan report`: a sweep's results file as tables, plots and one HTML page."""

from __future__ import annotations

import click


@click.command()
@click.argument("results", metavar="RESULTS.jsonl", type=click.Path(dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False),
              help="Folder for summary.csv, summary.md, plots/ and index.html.")
@click.option("--no-plots", is_flag=True, help="Tables and the HTML page only.")
def report(results: str, output: str, no_plots: bool) -> None:
    """Summary tables, plots (MFU and tokens/s against GPUs, memory of the winners) and the
    configuration chosen at each scale, together on one page (index.html)."""
    from solver.sweep.report import write_report
    from solver.sweep.results import read_results

    lines, torn = read_results(results)
    if torn:
        click.echo(f"{results}: skipped an incomplete last line (a sweep still writing, or "
                   "killed: rerun it to redo that problem)", err=True)
    answer = write_report(lines, output, plots=not no_plots)
    counts = ", ".join(f"{n} {status}" for status, n in answer.status_counts.items())
    click.echo(f"{answer.directory / 'index.html'}: {sum(answer.status_counts.values())} "
               f"problems ({counts or 'none'}); tables summary.csv, summary.md")
    if answer.plots_skipped is not None and not no_plots:
        click.echo(f"plots skipped: {answer.plots_skipped}")
