"""Command line: ``fedpeft run | export | predict | generate | evaluate | methods | components | tasks | models |
suites | config | report | compare | flower (superlink | supernode | certs | node-key | register | run)``; one module
per group of commands, registered here in the order ``--help`` lists them."""

from __future__ import annotations

import typer

from fedpeft.cli import catalogue, experiment, flower, reports, trained

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_show_locals=False,
                  help="Federated fine-tuning of frozen language models with parameter-efficient methods.")
for command in (experiment.run, trained.export, trained.predict, trained.generate, trained.evaluate,
                catalogue.methods, catalogue.components, catalogue.tasks, catalogue.models, catalogue.suites,
                catalogue.config, reports.report, reports.compare):
    app.command()(command)
app.add_typer(flower.app, name="flower")


def main() -> None:  # console-script entry point
    from fedpeft.plugins import PluginError

    try:
        app()
    except PluginError as e:  # raised wherever a command first loads the registries: one line, not a traceback
        from rich.console import Console
        from rich.markup import escape

        Console(stderr=True).print(f"[bold red]error:[/] {escape(str(e))}", soft_wrap=True)
        raise SystemExit(2) from None
