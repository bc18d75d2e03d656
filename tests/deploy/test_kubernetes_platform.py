"""deploy/kubernetes/platform/ (the platform kit: ServiceMonitor, in-flight HPA with prometheus-adapter rules,
InferencePool, Grafana dashboard) validated offline: built-in kinds against the Kubernetes OpenAPI schemas
(kubernetes-validate, strict), the custom resources against their CRDs' own schemas (vendored in
tests/deploy/crds/, see its README) with unknown fields refused as `kubectl --validate=strict` refuses them, and
the wiring: what each piece names exists in the base manifests and in the gateway's /metrics. The dashboard's
queries also run against a real Prometheus scraping the gateway in tests/e2e/test_platform_metrics.py."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from openai_api.observability import Metrics
from openai_api.quota.service import QuotaService
from openai_api.settings import env_name, options
from tests.deploy.helpers import K8S

KIT = K8S / "platform"
CRDS = Path(__file__).parent / "crds"
DASHBOARD = KIT / "grafana-dashboard.json"
K8S_VERSIONS = ["1.30.0", "latest"]


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> the served version's openAPIV3Schema, from each vendored CRD."""
    out = {}
    for path in sorted(CRDS.glob("*.yaml")):
        crd = docs(path)[0]
        for version in crd["spec"]["versions"]:
            if version.get("served"):
                key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
                out[key] = version["schema"]["openAPIV3Schema"]
    return out


def unknown_fields(value: Any, schema: dict[str, Any], where: str = "") -> list[str]:
    """Fields the schema does not declare (a structural schema prunes them silently; strict validation refuses
    them): an object with `properties`, and neither `additionalProperties` nor x-kubernetes-preserve-unknown-fields."""
    out: list[str] = []
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for k, v in value.items():
            if where == "" and k in ("apiVersion", "kind", "metadata"):
                continue
            if props is not None and k in props:
                out += unknown_fields(v, props[k], f"{where}.{k}")
            elif isinstance(extra, dict):
                out += unknown_fields(v, extra, f"{where}.{k}")
            elif props is not None and not extra and not schema.get("x-kubernetes-preserve-unknown-fields"):
                out.append(f"{where}.{k}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(value):
            out += unknown_fields(v, schema["items"], f"{where}[{i}]")
    return out


MANIFESTS = sorted(p for p in KIT.glob("*.yaml") if p.name != "kustomization.yaml")
BUILT_IN = [(p, d) for p in MANIFESTS for d in docs(p) if "." not in d["apiVersion"].split("/")[0] or
            d["apiVersion"].startswith(("autoscaling/", "apps/"))]
CUSTOM = [(p, d) for p in MANIFESTS for d in docs(p) if (p, d) not in BUILT_IN]


def test_the_kit_has_each_piece() -> None:
    kinds = {d["kind"] for p in MANIFESTS for d in docs(p)}
    assert kinds == {"ServiceMonitor", "HorizontalPodAutoscaler", "ConfigMap", "InferencePool"}
    assert {d["kind"] for _, d in CUSTOM} == {"ServiceMonitor", "InferencePool"}


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_built_in_kinds_match_the_kubernetes_schema(version: str) -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate (dev extra) not installed")
    if version == "latest":
        version = kv.latest_version()
    for path, doc in BUILT_IN:
        try:
            kv.validate(doc, version, strict=True)
        except kv.ValidationError as exc:  # pragma: no cover - the message is the point
            pytest.fail(f"{path.name} ({doc['kind']}) against Kubernetes {version}: {exc}")


def test_custom_resources_match_their_crds() -> None:
    schemas = crd_schemas()
    for path, doc in CUSTOM:
        schema = schemas.get((doc["apiVersion"], doc["kind"]))
        assert schema is not None, f"{path.name}: no vendored CRD serves {doc['apiVersion']} {doc['kind']}"
        errors = [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(doc)]
        assert not errors, (path.name, errors)
        assert not unknown_fields(doc, schema), (path.name, unknown_fields(doc, schema))
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"])


def test_the_crd_check_refuses_what_the_api_server_would() -> None:
    schemas = crd_schemas()
    pool = docs(KIT / "inferencepool.yaml")[0]
    schema = schemas[(pool["apiVersion"], "InferencePool")]
    bad = json.loads(json.dumps(pool))
    bad["spec"]["targetPorts"] = [{"number": 70000}]
    assert list(jsonschema.Draft7Validator(schema).iter_errors(bad))
    del bad["spec"]["selector"]
    assert any("selector" in e.message for e in jsonschema.Draft7Validator(schema).iter_errors(bad))
    monitor = docs(KIT / "servicemonitor.yaml")[0]
    monitor["spec"]["endpoints"][0]["bearerTokenFiles"] = "/x"  # a misspelt field
    assert unknown_fields(monitor, schemas[(monitor["apiVersion"], "ServiceMonitor")]) == \
        [".spec.endpoints[0].bearerTokenFiles"]


def base(kind: str, name: str) -> dict[str, Any]:
    for path in K8S.glob("*.yaml"):
        for doc in docs(path) if path.name != "kustomization.yaml" else []:
            if doc["kind"] == kind and doc["metadata"]["name"] == name:
                return doc
    raise AssertionError(f"no {kind} {name} in deploy/kubernetes")


def test_the_pieces_point_at_the_gateway() -> None:
    deployment, service = base("Deployment", "openai-api"), base("Service", "openai-api")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "gateway"]
    monitor = docs(KIT / "servicemonitor.yaml")[0]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    pool = docs(KIT / "inferencepool.yaml")[0]
    assert pool["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert [p["number"] for p in pool["spec"]["targetPorts"]] == [p["containerPort"] for p in container["ports"]]
    hpa = docs(KIT / "hpa-in-flight.yaml")[0]
    assert hpa["metadata"]["name"] == base("HorizontalPodAutoscaler", "openai-api")["metadata"]["name"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    rules = yaml.safe_load(docs(KIT / "prometheus-adapter-rules.yaml")[0]["data"]["config.yaml"])["rules"]
    published = {r["name"]["as"] for r in rules}
    for metric in hpa["spec"]["metrics"]:
        if metric["type"] == "Pods":
            assert metric["pods"]["metric"]["name"] in published
    for rule in rules:  # each rule's series is one the gateway exports, and its name fits the custom metrics API
        series = rule["seriesQuery"].split("{")[0]
        assert series in exported_names(), series
        assert re.fullmatch(r"[a-z0-9_]+", rule["name"]["as"]) and re.search(rule["name"]["matches"], series)


def test_the_kustomization_wires_the_kit() -> None:
    kustomization = yaml.safe_load((KIT / "kustomization.yaml").read_text(encoding="utf-8"))
    listed = {*kustomization["resources"], *(p["path"] for p in kustomization["patches"] if "path" in p)}
    assert listed == {"../", *(p.name for p in MANIFESTS)}
    assert kustomization["configMapGenerator"][0]["files"] == ["openai-api.json=grafana-dashboard.json"]
    patch = next(p["patch"] for p in kustomization["patches"] if "patch" in p)
    env = yaml.safe_load(patch)[0]["value"]
    assert env["name"] == env_name("open_vllm_metrics", dict(options())["open_vllm_metrics"])
    assert env["value"] == "true"


def exported_names() -> set[str]:
    """Every sample name the gateway's /metrics can hold (families with no sample yet included)."""
    metrics = Metrics()
    QuotaService(None, [], metrics)  # the per-key counters
    text = metrics.render().decode()
    families = set(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    names = set()
    for name, kind in families:
        names |= {name, f"{name}_total", f"{name}_bucket", f"{name}_sum", f"{name}_count"} if kind != "gauge" \
            else {name}
    return names


def test_the_dashboard_is_grafana_json_over_metrics_the_gateway_exports() -> None:
    dash = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert dash["uid"] and dash["title"] and isinstance(dash["schemaVersion"], int)
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert variables == {"DS_PROMETHEUS", "model_name"}
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) and len(ids) >= 10
    names = exported_names()
    for p in dash["panels"]:
        assert p["datasource"]["uid"] == "${DS_PROMETHEUS}" and {"h", "w", "x", "y"} <= p["gridPos"].keys()
        assert p["targets"], p["title"]
        for t in p["targets"]:
            used = metric_names(t["expr"])
            assert used and used <= names, (p["title"], used - names)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers that are not functions, grouping labels, label
    matchers, ranges or numbers."""
    bare = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", " ", expr)
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"", " ", bare)
    words = re.findall(r"(?<![\w.:])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", bare)
    return {w for w, call in words if not call} - {"and", "or", "unless", "bool", "offset"}
