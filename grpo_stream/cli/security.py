"""`grpo-stream security-check RUN_DIR`: try the attacks that broke live runs against your own
deployment (`grpo_stream.securitycheck`), each printed HELD or BROKEN."""

from __future__ import annotations

from pathlib import Path

import typer

from grpo_stream.cli.common import fail


def security_check(
    run_dir: Path = typer.Argument(..., help="The run directory of a live run."),
) -> None:
    """Try the attacks that broke live runs (issue #49) against this deployment.

    Strangers' messages, weights requests and dashboard requests without credentials, a Hello
    recorded for another hub, a replayed Hello, a generator's impossible rollouts: each line
    says HELD, BROKEN or SKIPPED (and why). Exits 1 when any attack is BROKEN (or none could
    be tried)."""
    from grpo_stream.securitycheck import Target, run_checks

    try:
        target = Target.of(run_dir)
    except ValueError as exc:
        fail(str(exc))
    verdicts = run_checks(target, typer.echo)
    counts = {word: 0 for word in ("BROKEN", "HELD", "SKIPPED")}
    for verdict in verdicts:
        counts[verdict.line().split()[0]] += 1
    typer.echo(", ".join(f"{n} {word}" for word, n in counts.items()))
    if counts["BROKEN"] or not counts["HELD"]:  # broken, or nothing could be tried
        raise typer.Exit(1)
