"""docker-compose.yml and the monitoring files: guarded secrets, loopback ports,
a `monitoring` profile, and alert rules that name metrics we really expose.

`docker compose config` runs when the docker CLI has compose; the YAML checks
run everywhere (no Docker engine is needed for either)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
SIGNALBOX_SERVICES = ("migrate", "api", "worker", "beat", "smtp", "flower")
LONG_RUNNING = ("api", "worker", "beat", "smtp", "flower")


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def exposed_metric_names() -> set[str]:
    """Every family our processes expose: the counters and histograms of
    app.observability.metrics and the gauges of app.observability.exposition."""
    from app.observability import metrics

    names = {declared._name for declared in metrics.DECLARED}
    source = (ROOT / "app" / "observability" / "exposition.py").read_text()
    names |= set(re.findall(r'GaugeMetricFamily\(\s*"(signalbox_[a-z_]+)"', source))
    return names


def _family(sample: str) -> str:
    for suffix in ("_total", "_bucket", "_sum", "_count"):
        if sample.endswith(suffix):
            return sample[: -len(suffix)]
    return sample


def test_compose_refuses_to_start_without_a_token_and_a_flower_password() -> None:
    text = COMPOSE.read_text()
    assert re.search(r"SIGNALBOX_API_TOKENS: \$\{SIGNALBOX_API_TOKENS:\?[^}]+\}", text)
    assert re.search(
        r"SIGNALBOX_FLOWER_BASIC_AUTH: \$\{SIGNALBOX_FLOWER_BASIC_AUTH:\?[^}]+\}", text
    )
    assert "change_me" not in text and "change-me" not in text
    env = compose()["x-signalbox-env"]
    for service in SIGNALBOX_SERVICES:
        environment = compose()["services"][service]["environment"]
        assert environment["SIGNALBOX_API_TOKENS"] == env["SIGNALBOX_API_TOKENS"], service


def test_every_published_port_is_on_loopback_unless_told_otherwise() -> None:
    published = 0
    for name, service in compose()["services"].items():
        for port in service.get("ports", []):
            published += 1
            assert isinstance(port, str), name
            assert port.startswith("${SIGNALBOX_PUBLISH_HOST:-127.0.0.1}:"), (name, port)
    assert published >= 5


def test_every_signalbox_container_serves_its_metrics_and_only_beat_the_gauges() -> None:
    services = compose()["services"]
    for name in ("api", "worker", "beat", "smtp"):
        env = services[name]["environment"]
        assert env["SIGNALBOX_METRICS_PORT"] == "9100", name
        assert env["SIGNALBOX_METRICS_DB_GAUGES"] == ("true" if name == "beat" else "false"), name
    for name in LONG_RUNNING:
        assert "healthcheck" in services[name], name
    assert services["worker"]["healthcheck"]["test"] == [
        "CMD",
        "signalbox-server",
        "probe",
        "worker",
    ]
    assert services["beat"]["healthcheck"]["test"] == ["CMD", "signalbox-server", "probe", "beat"]


def test_the_monitoring_profile_runs_prometheus_with_our_rules_and_grafana_with_our_dashboard() -> (
    None
):
    services = compose()["services"]
    for name in ("prometheus", "grafana"):
        assert services[name]["profiles"] == ["monitoring"], name
    for name, service in services.items():
        if name not in ("prometheus", "grafana"):
            assert "profiles" not in service, f"{name} must run without a profile"
    mounts = {
        v.split(":")[0]: v.split(":")[1] for v in services["prometheus"]["volumes"] if ":" in v
    }
    assert mounts["./config/prometheus.yml"] == "/etc/prometheus/prometheus.yml"
    assert mounts["./config/prometheus-rules.yml"] == "/etc/prometheus/prometheus-rules.yml"
    config = yaml.safe_load((ROOT / "config" / "prometheus.yml").read_text())
    assert config["rule_files"] == ["/etc/prometheus/prometheus-rules.yml"]
    [job] = config["scrape_configs"]
    [dns] = job["dns_sd_configs"]
    assert set(dns["names"]) == {"api", "worker", "smtp", "beat"} and dns["port"] == 9100

    grafana = {v.split(":")[0]: v.split(":")[1] for v in services["grafana"]["volumes"]}
    assert grafana["./config/grafana-dashboard.json"].startswith("/var/lib/grafana/dashboards/")
    providers = yaml.safe_load((ROOT / "config" / "grafana-dashboards.yml").read_text())
    assert providers["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    datasources = yaml.safe_load((ROOT / "config" / "grafana-datasources.yml").read_text())
    assert datasources["datasources"][0]["url"] == "http://prometheus:9090"
    for source in grafana:
        assert (ROOT / source).exists(), source


def test_every_alert_and_panel_names_metrics_we_expose() -> None:
    known = exposed_metric_names()
    rules = yaml.safe_load((ROOT / "config" / "prometheus-rules.yml").read_text())
    alerts = [rule for group in rules["groups"] for rule in group["rules"]]
    assert len(alerts) >= 8
    expressions = [str(rule["expr"]) for rule in alerts]
    for rule in alerts:
        assert rule["alert"].startswith("Signalbox") and rule["annotations"]["summary"]
    dashboard = json.loads((ROOT / "config" / "grafana-dashboard.json").read_text())
    expressions += [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    used = set()
    for expr in expressions:
        for name in re.findall(r"\bsignalbox_[a-z_]+", expr):
            used.add(_family(name))
            assert _family(name) in known, f"{name} in {expr!r} is not exposed"
    # The alerts and panels watch every metric the processes expose.
    assert used >= known - {"signalbox_scrape_source_up"}, known - used


def test_the_image_also_carries_the_client_cli() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "--all-packages" in dockerfile
    assert "COPY clients/python/src clients/python/src" in dockerfile
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert "clients/python/src" not in ignored and "config" not in ignored


def _docker_compose() -> list[str] | None:
    docker = shutil.which("docker")
    if docker is None:
        return None
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30)
    return [docker, "compose"] if probe.returncode == 0 else None


def test_docker_compose_config_accepts_the_file_and_needs_the_secrets() -> None:
    command = _docker_compose()
    if command is None:
        pytest.skip("the docker CLI has no compose plugin here; the YAML checks above ran")
    base = {k: v for k, v in os.environ.items() if not k.startswith("SIGNALBOX_")}
    args = [*command, "-f", str(COMPOSE), "--profile", "monitoring", "config", "--quiet"]
    refused = subprocess.run(args, env=base, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "SIGNALBOX_API_TOKENS" in refused.stderr
    env = {**base, "SIGNALBOX_API_TOKENS": "ci:x", "SIGNALBOX_FLOWER_BASIC_AUTH": "a:b"}
    accepted = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    assert accepted.returncode == 0, accepted.stderr


def test_compose_passes_every_secret_the_pods_read_and_writes_none() -> None:
    from tests.deploy.test_kubernetes import recipe, secret_settings

    env = compose()["x-signalbox-env"]
    documented = {k for k in recipe() if k.startswith("SIGNALBOX_")}
    secrets = {k for k in env if k in documented or k in secret_settings()}
    # Same list as the Kubernetes recipe (KEDA aside), every secret setting on it.
    assert secrets == documented >= secret_settings(), secrets ^ documented
    for key in secrets:
        value = env[key]
        if key.endswith("_URL") and "WEBHOOK" not in key:
            # The compose file's own PostgreSQL and Redis, never published.
            assert re.fullmatch(
                r"(postgresql://signalbox:signalbox@postgres|redis://redis)\S+", value
            )
        elif value is not None:
            assert value.startswith(f"${{{key}:?"), f"{key}: neither required nor from the shell"
    for service in SIGNALBOX_SERVICES:
        assert set(compose()["services"][service]["environment"]) >= secrets, service
