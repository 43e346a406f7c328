"""The `grpo-stream` command line (Typer). Heavy imports happen inside commands."""
