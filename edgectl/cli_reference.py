"""The CLI reference (docs/reference/cli.md), rendered from the typer app so it cannot drift.

``python -m edgectl.cli_reference > docs/reference/cli.md`` regenerates it, and
tests/test_cli_reference.py fails while the committed file differs. The markdown is written here
from each command's own parameters (names, help, defaults), never captured from ``--help``, whose
layout follows the terminal's width: the same code gives the same bytes on every machine.
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import PurePath

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from edgectl.cli import app

REGENERATE_COMMAND = "python -m edgectl.cli_reference > docs/reference/cli.md"

_CODE_SPAN = re.compile(r"(`[^`]*`)")


def render_cli_reference() -> str:
    """The markdown of every command and subcommand: usage, help, each argument and option."""
    root = typer.main.get_command(app)
    if not isinstance(root, TyperGroup):
        raise TypeError(f"edgectl's app became a {type(root).__name__}, not a group of commands")
    root_context = typer.Context(root, info_name="edgectl")
    commands = _subcommands(root, root_context)
    sections = [_section(root, root_context)] + [_section(command, context) for command, context in commands]
    index = ", ".join(f"[`{c.command_path}`](#{_anchor(c.command_path)})" for _, c in commands)
    head = [
        "# CLI reference",
        "",
        f"Generated from edgectl's command line by `{REGENERATE_COMMAND}`;",
        "do not edit by hand (tests/test_cli_reference.py fails while this file differs from the code).",
        "Every command also takes `--help`. Bad input: one `error:` line on stderr and exit code 2.",
        "",
        f"Commands: {index}.",
    ]
    return "\n\n".join(["\n".join(head), *sections]) + "\n"


def _subcommands(group: TyperGroup, context: typer.Context) -> list[tuple[TyperCommand | TyperGroup, typer.Context]]:
    """Every visible command below ``group``, depth first, in the order ``--help`` lists them."""
    found: list[tuple[TyperCommand | TyperGroup, typer.Context]] = []
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        if not isinstance(command, (TyperCommand, TyperGroup)):
            raise TypeError(f"{context.command_path} {name}: {type(command).__name__} is not a typer command")
        if command.hidden:
            continue
        child = typer.Context(command, info_name=name, parent=context)
        found.append((command, child))
        if isinstance(command, TyperGroup):
            found.extend(_subcommands(command, child))
    return found


def _section(command: TyperCommand | TyperGroup, context: typer.Context) -> str:
    arguments = [p for p in command.params if isinstance(p, TyperArgument) and not p.hidden]
    options = [p for p in command.params if isinstance(p, TyperOption) and not p.hidden]
    lines = [f"## `{context.command_path}`", "", "```", _usage(command, context, arguments), "```"]
    if command.help:
        lines += ["", _prose(inspect.cleandoc(command.help))]
    if arguments:
        lines += ["", "Arguments:", ""] + [_argument_line(p) for p in arguments]
    if options:
        lines += ["", "Options:", ""] + [_option_line(p, context) for p in options]
    return "\n".join(lines)


def _usage(command: TyperCommand | TyperGroup, context: typer.Context, arguments: list[TyperArgument]) -> str:
    pieces = [context.command_path, command.options_metavar]
    for argument in arguments:
        pieces.append(_argument_name(argument) if argument.required else f"[{_argument_name(argument)}]")
    if isinstance(command, TyperGroup):
        pieces.append("COMMAND [ARGS]...")
    return " ".join(pieces)


def _argument_name(argument: TyperArgument) -> str:
    return argument.metavar or (argument.name or "").upper()


def _argument_line(argument: TyperArgument) -> str:
    required = "required" if argument.required else _default_text(argument) or "optional"
    return f"- `{_argument_name(argument)}` ({required}): {_prose(argument.help or '')}".rstrip()


def _option_line(option: TyperOption, context: typer.Context) -> str:
    names = ", ".join(option.opts + option.secondary_opts)
    if not option.is_flag:
        names = f"{names} {option.metavar or option.display_type(context)}"
    default = _default_text(option)
    suffix = f" ({default})" if default else ""
    return f"- `{names}`{suffix}: {_prose(option.help or '')}".rstrip()


def _default_text(param: TyperArgument | TyperOption) -> str:
    """`default: X` where there is one to show; flags off by default and unset options show none."""
    if isinstance(param.show_default, str):
        return f"default: {param.show_default}"
    default = param.default
    is_off_flag = isinstance(param, TyperOption) and param.is_flag and default is False
    if not param.show_default or default is None or callable(default) or is_off_flag:
        return ""
    value = default.value if hasattr(default, "value") else default  # an Enum's value, as typed
    if isinstance(value, PurePath):
        value = str(value)
    return f"default: `{value}`"


def _prose(text: str) -> str:
    """Help text as markdown: `<` escaped outside code spans, so `<date>` is not read as HTML."""
    parts = _CODE_SPAN.split(text)
    return "".join(part if part.startswith("`") else part.replace("<", "\\<") for part in parts)


def _anchor(heading: str) -> str:
    """GitHub's anchor of a `## `command`` heading: lower case, spaces to dashes, backticks dropped."""
    return heading.lower().replace(" ", "-")


if __name__ == "__main__":
    sys.stdout.write(render_cli_reference())
