"""The command line: parse, make one call into the core, render the result.

This is the only place that turns :class:`~edgectl.errors.EdgectlError` into an
``error:`` line and an exit code; nothing below it prints tracebacks at users.
"""

from __future__ import annotations

import sys

import typer

from edgectl.errors import EdgectlError

app = typer.Typer(
    name="edgectl",
    help="Serve a language model on a small CPU box with vLLM's CPU backend, planned from measurements.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register_commands() -> None:
    # Each module adds its own commands; all of them import only the light control plane.
    from edgectl.commands import ALL

    for module in ALL:
        module.register(app)


_register_commands()


def main(argv: list[str] | None = None) -> None:
    try:
        app(args=argv, prog_name="edgectl")
    except EdgectlError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        for line in exc.details:
            print(line, file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)


if __name__ == "__main__":  # pragma: no cover
    main()
