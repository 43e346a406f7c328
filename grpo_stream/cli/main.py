"""Entry point: one Typer app, one module per command group; `--help` imports no torch."""

from __future__ import annotations

import sys

import typer

from grpo_stream.cli import dashboard, fingerprint, keys, logs, plan, run, security, status, up
from grpo_stream.cli import eval as eval_cmd
from grpo_stream.cli import export as export_cmd

app = typer.Typer(
    name="grpo-stream",
    help="GRPO reinforcement learning as an asynchronous streaming pipeline of services.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("up")(up.up)
app.command("run")(run.run)
app.command("logs")(logs.logs)
app.add_typer(keys.app, name="keys")
app.command("fingerprint")(fingerprint.fingerprint)
app.command("plan")(plan.plan)
app.command("eval")(eval_cmd.evaluate)
app.command("status")(status.status)
app.command("dashboard")(dashboard.dashboard)
app.command("export")(export_cmd.export)
app.command("security-check")(security.security_check)


def main() -> None:
    try:
        app()
    except SystemExit as done:
        from grpo_stream.cli.service_exit import end_service_process, is_service_process

        if isinstance(done.code, int | None) and is_service_process(sys.argv):
            end_service_process(done.code or 0)  # a service: no interpreter teardown
        raise


if __name__ == "__main__":
    main()
