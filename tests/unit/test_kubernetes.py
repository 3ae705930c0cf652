"""deploy/kubernetes cannot be applied here (no cluster): check it against the Kubernetes API
schemas (``kubernetes-validate``, offline) and against the code, so that it does not rot.

* Every file of the base and the example overlay is valid YAML of a real API object, and the
  kustomizations list exactly the files that are there.
* The example overlay, rendered with ``kubectl kustomize`` (kustomize is built into kubectl;
  the test skips, saying so, where there is no kubectl), is valid against the schemas, strictly.
* What the manifests say is what the code does, read from the code: the settings in the
  ConfigMap and the Secret load (an unknown or bad one fails as it would at a pod's start), the
  container ports are the ports those settings give, the probe and scrape paths are routes the
  servers serve, the grace period is longer than the stop timeouts, the container args parse
  with the real CLI.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from streams.cli import build_parser
from streams.errors import ConfigError
from streams.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
BASE = DEPLOY / "base"
OVERLAY = DEPLOY / "overlays" / "example"
K8S_VERSION = "1.32.0"  # a version every maintained cluster serves the APIs used here in

COMPONENTS = {
    "worker": "trajstream-worker",
    "gateway": "trajstream-gateway",
    "otlp": "trajstream-otlp",
}


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def render(directory: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (which builds kustomize in) is not installed: rendering skipped")
    out = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def validate(obj: dict[str, Any]) -> None:
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        name = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
        raise AssertionError(f"{name}: {exc.message} at {list(exc.path)}") from exc


# -- the files ---------------------------------------------------------------------------------


@pytest.mark.parametrize("directory", [BASE, OVERLAY], ids=["base", "overlay"])
def test_the_kustomization_lists_exactly_the_files_there(directory: Path) -> None:
    kustomization = docs(directory / "kustomization.yaml")[0]
    listed = [r for r in kustomization.get("resources", []) if not r.startswith("..")]
    listed += [p["path"] for p in kustomization.get("patches", [])]
    present = sorted(p.name for p in directory.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(listed) == present


@pytest.mark.parametrize(
    "path",
    [p for p in sorted(BASE.glob("*.yaml")) if p.name != "kustomization.yaml"]
    + [OVERLAY / "namespace.yaml", OVERLAY / "secret.yaml"],
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_each_whole_object_is_valid_against_the_kubernetes_schemas(path: Path) -> None:
    for obj in docs(path):
        validate(obj)


def test_the_rendered_overlay_is_valid_and_complete() -> None:
    objects = render(OVERLAY)
    for obj in objects:
        validate(obj)
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for name in COMPONENTS.values():
        assert ("Deployment", name) in kinds
    for name in ("trajstream-gateway", "trajstream-otlp"):
        assert ("Service", name) in kinds and ("HorizontalPodAutoscaler", name) in kinds
    assert ("PodDisruptionBudget", "trajstream-worker") in kinds
    assert {o["metadata"].get("namespace") for o in objects if o["kind"] != "Namespace"} == {
        "trajstream"
    }


# -- the code ------------------------------------------------------------------------------


@pytest.fixture(params=["base", "overlay"])
def rendered(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return render(BASE if request.param == "base" else OVERLAY)


def settings_of(objects: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings a pod gets: the ConfigMap and the Secret as its environment."""
    for name in list(os.environ):
        if name.startswith("TRAJSTREAM_"):
            monkeypatch.delenv(name)
    env = dict(by_kind(objects, "ConfigMap")["trajstream-settings"]["data"])
    secret = by_kind(objects, "Secret").get("trajstream-secrets")
    if secret is not None:
        env.update(secret.get("stringData", {}))
    for key, value in env.items():
        assert key.startswith("TRAJSTREAM_"), f"{key} is not a trajstream setting"
        monkeypatch.setenv(key, str(value))
    return load_settings()  # an unknown or bad setting raises ConfigError, naming it


def pod(objects: list[dict[str, Any]], component: str) -> dict[str, Any]:
    return by_kind(objects, "Deployment")[COMPONENTS[component]]["spec"]["template"]


def container(objects: list[dict[str, Any]], component: str) -> dict[str, Any]:
    (only,) = pod(objects, component)["spec"]["containers"]
    return only


def port_of(c: dict[str, Any], name: str) -> int:
    return next(p["containerPort"] for p in c["ports"] if p["name"] == name)


def get_routes(app: Any) -> set[str]:
    return {
        r.resource.canonical for r in app.router.routes() if r.method == "GET" and r.resource
    }


def test_the_settings_load_and_every_pod_reads_them(
    rendered: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings_of(rendered, monkeypatch)
    for component in COMPONENTS:
        spec = pod(rendered, component)["spec"]
        refs = container(rendered, component)["envFrom"]
        assert {"configMapRef": {"name": "trajstream-settings"}} in refs
        assert any(r.get("secretRef", {}).get("name") == "trajstream-secrets" for r in refs)
        # service links would add TRAJSTREAM_GATEWAY_PORT=tcp://... for the Service
        # trajstream-gateway: an unknown setting, which stops the process at start
        assert spec["enableServiceLinks"] is False


def test_the_container_args_are_real_commands(rendered: list[dict[str, Any]]) -> None:
    for component in COMPONENTS:
        args = container(rendered, component)["args"]
        assert build_parser().parse_args(args).command == component


def test_the_worker_probes_and_scrape_are_its_observe_server(
    rendered: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from streams.observe.metrics import Metrics
    from streams.observe.web import ObserveServer

    settings = settings_of(rendered, monkeypatch)
    c = container(rendered, "worker")
    port = port_of(c, "metrics")
    assert port == settings.observe.port and settings.observe.host == "0.0.0.0"
    server = ObserveServer(Metrics(worker="w", app_id="a", inputs=()), "127.0.0.1", 0)
    routes = get_routes(server.application())
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz" in routes
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz" in routes
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["port"] in ("metrics", port)
    annotations = pod(rendered, "worker")["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == port
    assert annotations["prometheus.io/path"] in routes


def test_the_workers_stop_gracefully_within_the_grace_period(
    rendered: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = settings_of(rendered, monkeypatch)
    worker = pod(rendered, "worker")["spec"]
    assert worker["terminationGracePeriodSeconds"] > settings.stop_timeout_s
    gateway = pod(rendered, "gateway")["spec"]
    assert gateway["terminationGracePeriodSeconds"] > settings.gateway.flush_timeout_s
    deployment = by_kind(rendered, "Deployment")["trajstream-worker"]
    assert deployment["spec"]["replicas"] <= settings.kafka.partitions, "idle workers"


def test_the_worker_disruption_budget_covers_the_workers(rendered: list[dict[str, Any]]) -> None:
    pdb = by_kind(rendered, "PodDisruptionBudget")["trajstream-worker"]
    labels = pod(rendered, "worker")["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1


def test_the_gateway_listens_and_answers_where_the_manifests_say(
    rendered: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from streams.capture.gateway import build_gateway

    settings = settings_of(rendered, monkeypatch)
    c = container(rendered, "gateway")
    assert port_of(c, "http") == settings.gateway.port and settings.gateway.host == "0.0.0.0"
    # 0.0.0.0 is an open relay without client keys: the example Secret carries them; the base
    # alone (no Secret) is refused (test_each_container_passes_its_start_up_checks)
    served = settings.model_copy(
        update={"gateway": settings.gateway.model_copy(update={"allow_anonymous": True})}
    )
    routes = get_routes(build_gateway(served if not settings.gateway.api_keys else settings).app())
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"] in routes
    # replicas behind a Service that is not sticky on /calls/<id>: no step counts on END
    assert by_kind(rendered, "HorizontalPodAutoscaler")["trajstream-gateway"]["spec"][
        "maxReplicas"
    ] > 1
    assert settings.gateway.count_steps is False
    assert str(settings.gateway.spill_dir).startswith(
        next(m["mountPath"] for m in c["volumeMounts"] if m["name"] == "data")
    ), "the spill dir is on the pod's writable volume"


@pytest.mark.parametrize("component", list(COMPONENTS))
def test_each_container_passes_its_start_up_checks(
    rendered: list[dict[str, Any]], component: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the pod's process runs first (streams.cli.startup: its args, the settings of the
    ConfigMap and the Secret, the command's own checks). The overlay's pods all start; the base
    alone has no Secret, so its gateway refuses, naming the two settings."""
    from streams.cli import startup

    settings_of(rendered, monkeypatch)
    args = container(rendered, component)["args"]
    has_secret = by_kind(rendered, "Secret").get("trajstream-secrets") is not None
    if component == "gateway" and not has_secret:
        with pytest.raises(ConfigError, match=r"gateway\.api_keys.*gateway\.allow_anonymous"):
            startup(args)
    else:
        startup(args)


def test_the_example_secret_and_its_kubectl_line_carry_the_same_keys() -> None:
    """The `kubectl create secret` line in secret.yaml's comment makes the same Secret."""
    path = OVERLAY / "secret.yaml"
    (secret,) = docs(path)
    literals = set(re.findall(r"--from-literal=(TRAJSTREAM_[A-Z_]+)=", path.read_text()))
    assert literals == set(secret["stringData"]), "the kubectl line and the Secret differ"
    assert "TRAJSTREAM_GATEWAY__API_KEYS" in literals


def test_the_otlp_ingest_listens_where_the_manifests_say(
    rendered: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = settings_of(rendered, monkeypatch)
    c = container(rendered, "otlp")
    assert port_of(c, "otlp-http") == settings.otlp.port and settings.otlp.host == "0.0.0.0"
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["tcpSocket"]["port"] == "otlp-http"


@pytest.mark.parametrize("component", ["gateway", "otlp"])
def test_services_and_autoscalers_point_at_their_pods(
    rendered: list[dict[str, Any]], component: str
) -> None:
    name = COMPONENTS[component]
    template = pod(rendered, component)
    service = by_kind(rendered, "Service")[name]
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    names = {p["name"] for p in container(rendered, component)["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= names
    hpa = by_kind(rendered, "HorizontalPodAutoscaler")[name]
    target = {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
    assert hpa["spec"]["scaleTargetRef"] == target
    deployment = by_kind(rendered, "Deployment")[name]
    assert "replicas" not in deployment["spec"], "the autoscaler owns the replica count"
    assert container(rendered, component)["resources"]["requests"]["cpu"]


def test_service_links_would_stop_a_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    """Why every pod sets enableServiceLinks: false: what Kubernetes injects for the Service
    trajstream-gateway looks like a setting, and trajstream refuses unknown settings."""
    from streams.errors import ConfigError

    monkeypatch.setenv("TRAJSTREAM_GATEWAY_PORT", "tcp://10.0.0.7:8000")
    with pytest.raises(ConfigError, match="TRAJSTREAM_GATEWAY_PORT"):
        load_settings()
