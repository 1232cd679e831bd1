"""`tally completion bash|zsh|fish`: the shell completion script (click's), printed to be
sourced: commands, options, choices and, from the login, program ids."""

from __future__ import annotations

import click
from click.shell_completion import get_completion_class

from api.cli.options import examples

SHELLS = ("bash", "zsh", "fish")
COMPLETE_VAR = "_TALLY_COMPLETE"  # what the script sets when it asks `tally` for completions

INSTALL = """to install:
  bash: add  eval "$(tally completion bash)"  to ~/.bashrc (bash 4.4 or later)
  zsh:  add  eval "$(tally completion zsh)"  to ~/.zshrc
  fish: tally completion fish > ~/.config/fish/completions/tally.fish"""


@click.command(
    short_help="print the shell completion script (bash, zsh or fish)",
    epilog=examples(
        'eval "$(tally completion bash)"',
        "tally completion fish > ~/.config/fish/completions/tally.fish",
        after=INSTALL,
    ),
)
@click.argument("shell", type=click.Choice(SHELLS))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    """Print the script that makes SHELL complete tally's commands, options and their values
    (program ids come from the server of the login). The `tally` it calls must be on PATH."""
    root = ctx.find_root().command
    complete = get_completion_class(shell)
    assert complete is not None  # one of SHELLS, each built into click
    click.echo(complete(root, {}, "tally", COMPLETE_VAR).source())
