"""Plain help for every `dsh` command: usage lines and option names as command-line tools write them.

Layer: CLI. Typer's plain help writes a required argument as `{ID}` in the usage line and types as
`<int range>` or `<str>` after each name. `dsh` writes them the classic way instead
(docs/cli.md#help): `Usage: dsh history [OPTIONS] ID`, an argument listed as `ID`, an option as
`--before SEQ` or `--limit LIMIT` (the metavar it declares, or its name in capitals), and a flag
alone. The help text of each parameter (its range, its default, `required`) stays as Typer writes
it. `PlainCommand` and `PlainGroup` are the classes of every command and of the root.
"""

from typing import Any

from typer.core import TyperCommand, TyperGroup

__all__ = ["PlainCommand", "PlainGroup", "metavar_of"]

# Typer builds on its own copy of click, so parameters are told apart by `param_type_name` (as
# Typer itself does) and contexts and formatters are typed loosely here.


def metavar_of(param: Any) -> str:
    """The placeholder of a value: the declared metavar, else the parameter's name in capitals."""
    declared = param.metavar
    if declared:
        return str(declared)
    return str(param.name or "value").upper()


def _joined(opts: list[str]) -> str:
    """`-v, --verbose`: short forms first, as click writes them."""
    return ", ".join(sorted(opts, key=lambda opt: len(opt) - len(opt.lstrip("-/"))))


def _option_names(option: Any) -> str:
    names = _joined(list(option.opts))
    if option.secondary_opts:
        names += " / " + _joined(list(option.secondary_opts))
    if not option.is_flag and not option.count:
        names += f" {metavar_of(option)}"
    return names


def _usage_pieces(command: Any, ctx: Any) -> list[str]:
    pieces = [command.options_metavar] if command.options_metavar else []
    for param in command.get_params(ctx):
        if param.param_type_name == "argument":
            name = metavar_of(param) + ("..." if param.nargs != 1 else "")
            pieces.append(name if param.required else f"[{name}]")
    return pieces


def _format_params(command: Any, ctx: Any, formatter: Any) -> None:
    arguments: list[tuple[str, str]] = []
    options: list[tuple[str, str]] = []
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None:
            continue
        if param.param_type_name == "argument":
            arguments.append((metavar_of(param), record[1]))
        elif param.param_type_name == "option":
            options.append((_option_names(param), record[1]))
    if arguments:
        with formatter.section("Arguments"):
            formatter.write_dl(arguments)
    if options:
        with formatter.section("Options"):
            formatter.write_dl(options)


class PlainCommand(TyperCommand):
    """A `dsh` command whose help uses classic placeholders (see the module docs)."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        """`[OPTIONS]`, then each argument's metavar (in brackets when optional)."""
        return _usage_pieces(self, ctx)

    def format_options(self, ctx: Any, formatter: Any) -> None:
        """The Arguments and Options sections with classic names."""
        _format_params(self, ctx, formatter)


class PlainGroup(TyperGroup):
    """The root `dsh` command: its options with classic placeholders, then the commands."""

    def format_options(self, ctx: Any, formatter: Any) -> None:
        """The Options section with classic names, then the Commands section."""
        _format_params(self, ctx, formatter)
        self.format_commands(ctx, formatter)
