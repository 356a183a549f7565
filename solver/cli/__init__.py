"""The `parplan` command line: click commands only (parse, call the library, render).

Every project error and every usage error becomes one line on stderr and exit status 2, here
and nowhere else. A command's module is imported when that command runs or shows its own
help (click's lazy loading of subcommands), and command modules import their heavy
dependencies inside the command, so `parplan --help` imports click alone and stays fast.
"""

from __future__ import annotations

import errno
import importlib
import io
import os
import sys

import click

from solver.errors import ParplanError, render_one_line


# Each command: the module that defines it (as the attribute of the command's name) and its
# line in `parplan --help`, which is also the command's short help once loaded.
_COMMANDS = {
    "calibrate": ("solver.cli.calibrate_command",
                  "Fit bandwidth curves or error scales to measured runs."),
    "clusters": ("solver.cli.catalog_commands", "List the cluster presets and their GPUs."),
    "estimate": ("solver.cli.estimate_command",
                 "Memory and step time of one configuration, and whether it fits."),
    "launch": ("solver.cli.launch_command",
               "Process groups, a torch module or framework settings for a plan."),
    "models": ("solver.cli.catalog_commands",
               "List the model zoo (parameter counts from the architecture)."),
    "optimize": ("solver.cli.optimize_command",
                 "Ranked parallel configurations for a model on a cluster."),
    "report": ("solver.cli.report_command",
               "A self-contained page of a sweep's problems and plans (offline)."),
    "rl": ("solver.cli.rl_command",
           "RL post-training: rollout and training, colocated or split."),
    "serve": ("solver.cli.serve_command",
              "Serving plans for vLLM: TP, PP, DP, EP, KV cache, latency."),
    "sweep": ("solver.cli.sweep_command",
              "Solve every combination in parallel; resumable JSON lines."),
}


class _ParplanGroup(click.Group):
    """A click group whose errors are one stderr line and exit 2 (also under CliRunner), and
    whose commands load when used (_COMMANDS)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in _COMMANDS:
            return None
        module, short_help = _COMMANDS[cmd_name]
        command = getattr(importlib.import_module(module), cmd_name)
        command.short_help = short_help
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands' lines from _COMMANDS, without importing them."""
        with formatter.section("Commands"):
            formatter.write_dl([(name, line) for name, (_, line) in sorted(_COMMANDS.items())])

    def invoke(self, ctx: click.Context) -> object:
        """The command; an output error leaves as _OutputError, past click's own handling of
        a closed pipe (exit 1, no word)."""
        try:
            return super().invoke(ctx)
        except OSError as exc:
            if _is_output_error(exc):
                raise _OutputError(exc) from None
            raise

    def main(self, args=None, prog_name=None, **extra):  # type: ignore[override]
        extra["standalone_mode"] = False
        if sys.stdout is None:  # started with stdout closed (`>&-`)
            sys.stdout = _ClosedOutput()
        try:
            super().main(args=args, prog_name=prog_name or "parplan", **extra)
            sys.stdout.flush()  # a full disk shows here, not in the interpreter's exit
        except (_OutputError, OSError) as exc:
            cause = exc.args[0] if isinstance(exc, _OutputError) else exc
            if not _is_output_error(cause):
                raise
            _drop_stdout()
            click.echo(f"error: cannot write the output ({cause.strerror or cause})", err=True)
            sys.exit(2)
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
        sys.exit(0)


# What writing the output can fail with (a closed pipe is a BrokenPipeError): a full disk or
# quota, a file over its size limit, stdout closed, an I/O error. Any other OSError is a bug.
OUTPUT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EBADF, errno.EIO}


class _OutputError(Exception):
    """An OSError from writing the output (args[0]), carried past click's main."""


def _is_output_error(exc: OSError) -> bool:
    return isinstance(exc, BrokenPipeError) or exc.errno in OUTPUT_ERRNOS


class _ClosedOutput(io.TextIOBase):
    """sys.stdout when the process started without one: writing to it is an OSError (EBADF),
    answered like any other output error, and a command that prints nothing runs."""

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, "stdout is closed")


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's own flush at exit does not fail a
    second time on what is still buffered (a traceback after our error line)."""
    try:
        descriptor = sys.stdout.fileno()
    except (OSError, ValueError, AttributeError):  # CliRunner's or _ClosedOutput
        return
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, descriptor)
    os.close(null)


@click.group(cls=_ParplanGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="parplan")
def cli() -> None:
    """Plan distributed training and serving of large transformers.

    Give a model (zoo name, zoo TOML or Hugging Face config.json), a cluster (preset or file)
    and a job; get ranked parallel configurations with memory, step time and launch settings.
    """


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script and of `python -m solver`."""
    from solver.runtime import tune_allocator

    tune_allocator()
    cli.main(args=argv, prog_name="parplan")
