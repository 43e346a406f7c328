"""Settings of the run dashboard (`grpo-stream dashboard`, and the one `up` serves)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

DEFAULT_PORT = 8765


class DashboardSettings(BaseModel):
    """The read-only web page of a run: service graph, queues, curves, alarms."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    enabled: bool = True
    """`up` serves the dashboard beside the run (it needs the `dashboard` extra: without it
    `up` says so in one line and runs on). It polls nothing while no page is open."""
    host: str = "127.0.0.1"
    """Address the dashboard binds. Every request needs the token (token_file), on a loopback
    address too: another user of this machine is a stranger."""
    port: int = Field(DEFAULT_PORT, ge=0, le=65535)
    """Port the dashboard binds; 0, or a port in use, gets a free one. The address, with
    the token where one is needed, is printed and written to RUN_DIR/dashboard.url."""
    token_file: Path | None = None
    """A file holding the token pages must present. None: `up` (or `grpo-stream dashboard`)
    writes a new one to RUN_DIR/dashboard.token (mode 0600); the page's address, with the
    token, is written to RUN_DIR/dashboard.url (mode 0600)."""
    poll_s: float = Field(1.0, ge=0.1, le=60)
    """While a page is open: seconds between two reads of the run directory and two status
    requests to the hub (each pushed to the open pages)."""

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        if not value.strip() or any(c in value for c in "/ \t"):
            raise ValueError(f"must be a host name or IP address, got {value!r}")
        return value.strip()
