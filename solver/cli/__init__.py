"""The `parplan` command line: click commands only (parse, call the library, render).

Every project error and every usage error becomes one line on stderr and exit status 2, here
and nowhere else. Command modules import their heavy dependencies inside the command, so
`parplan --help` stays fast.
"""

from __future__ import annotations

import sys

import click

from solver.errors import ParplanError, render_one_line


class _ParplanGroup(click.Group):
    """A click group whose errors are one stderr line and exit 2 (also under CliRunner)."""

    def main(self, args=None, prog_name=None, **extra):  # type: ignore[override]
        extra["standalone_mode"] = False
        try:
            super().main(args=args, prog_name=prog_name or "parplan", **extra)
        except ParplanError as exc:
            click.echo(f"error: {render_one_line(str(exc))}", err=True)
            sys.exit(2)
        except click.exceptions.Abort:
            click.echo("error: aborted", err=True)
            sys.exit(130)
        except click.ClickException as exc:
            message = render_one_line(exc.format_message())
            click.echo(f"error: {message} (see `parplan --help`)", err=True)
            sys.exit(exc.exit_code)
        except BrokenPipeError:  # `parplan models | head`
            sys.exit(0)
        sys.exit(0)


@click.group(cls=_ParplanGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="parplan")
def cli() -> None:
    """Plan distributed training and serving of large transformers.

    Give a model (zoo name, zoo TOML or Hugging Face config.json), a cluster (preset or file)
    and a job; get ranked parallel configurations with memory, step time and launch settings.
    """


def _register_commands() -> None:
    from solver.cli import catalog_commands, estimate_command, optimize_command

    cli.add_command(catalog_commands.models)
    cli.add_command(catalog_commands.clusters)
    cli.add_command(estimate_command.estimate)
    from solver.cli import calibrate_command

    cli.add_command(calibrate_command.calibrate)
    cli.add_command(optimize_command.optimize)
    from solver.cli import serve_command

    cli.add_command(serve_command.serve)
    from solver.cli import report_command, sweep_command

    cli.add_command(sweep_command.sweep)
    cli.add_command(report_command.report)
    from solver.cli import launch_command

    cli.add_command(launch_command.launch)


_register_commands()


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script and of `python -m solver`."""
    from solver.runtime import tune_allocator

    tune_allocator()
    cli.main(args=argv, prog_name="parplan")
