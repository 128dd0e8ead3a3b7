"""docs/api.md is the project's own reference: every route of the OpenAPI
document and every setting is in it, and the sample config lists every setting."""

from __future__ import annotations

import re
from pathlib import Path

from app.server import create_app
from app.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parents[2]
API_MD = (ROOT / "docs" / "api.md").read_text()
EXAMPLE = (ROOT / "config" / "signalbox.toml.example").read_text()


def test_every_openapi_route_is_documented_with_its_method() -> None:
    app = create_app(load_settings(database_url="postgresql://unused/none"))
    routes = [
        f"{method.upper()} {path}"
        for path, operations in app.openapi()["paths"].items()
        for method in operations
    ]
    assert len(routes) >= 20
    missing = [r for r in routes if f"`{r}" not in API_MD]
    assert missing == []


def test_every_setting_is_documented() -> None:
    missing = [
        f"SIGNALBOX_{name.upper()}"
        for name in Settings.model_fields
        if f"SIGNALBOX_{name.upper()}" not in API_MD
    ]
    assert missing == []


def test_the_sample_config_names_every_setting_commented_out_and_parses() -> None:
    import tomllib

    keys = set(re.findall(r"^# ([a-z_]+) = ", EXAMPLE, re.MULTILINE))
    assert set(Settings.model_fields) <= keys
    # Uncommented, the sample is valid TOML with the documented defaults.
    uncommented = re.sub(r"^# ([a-z_]+ = )", r"\1", EXAMPLE, flags=re.MULTILINE)
    values = tomllib.loads(uncommented)
    defaults = Settings.model_fields
    for key in ("api_port", "smtp_port", "webhook_retry_hours", "console_session_hours"):
        assert values[key] == defaults[key].default


def test_the_docs_never_send_the_reader_outside_the_repository() -> None:
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        assert "CONTRACT" not in text and "../shared" not in text, path
