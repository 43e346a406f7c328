"""dashboard.* settings: on by default on loopback; bad values are one line naming the field."""

from __future__ import annotations

import pytest

from grpo_stream.config import ConfigError, load_config


def test_the_default_run_serves_its_dashboard_on_loopback() -> None:
    dash = load_config(None).dashboard
    assert (dash.enabled, dash.host, dash.token_file) == (True, "127.0.0.1", None)


@pytest.mark.parametrize(
    ("override", "field"),
    [("dashboard.port=70000", "dashboard.port"), ("dashboard.poll_s=0", "dashboard.poll_s"),
     ('dashboard.host="http://x/"', "dashboard.host"), ("dashboard.colour=1", "dashboard.colour")],
)  # fmt: skip
def test_a_bad_dashboard_setting_names_its_field(override: str, field: str) -> None:
    with pytest.raises(ConfigError, match=f"invalid config: {field}"):
        load_config(None, [override])
