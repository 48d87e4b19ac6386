"""deploy/k8s/: the kustomize base and its cpu and gpu overlays, rendered with `kubectl kustomize` (skipped, saying
why, without kubectl) and validated strictly against Kubernetes' schemas (kubernetes-validate); the base's files
are validated one by one without kubectl too. Plus what the objects must agree on: selectors, the HPA's metric and
the prometheus-adapter rule, probes and the grace period."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from .manifests import DEPLOY, load_all, probe_window, serve_args_parse, validate_core, kustomize

pytestmark = pytest.mark.deploy

K8S = DEPLOY / "k8s"
OVERLAYS = ("cpu", "gpu")
KINDS = {"ConfigMap", "Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Service"}


def base_documents() -> list[tuple[Path, dict]]:
    return [(p, d) for p in sorted((K8S / "base").glob("*.yaml")) if p.name != "kustomization.yaml" for d in load_all(p)]


@pytest.mark.parametrize("path,doc", [pytest.param(p, d, id=f"{p.name}:{d['kind']}") for p, d in base_documents()])
def test_the_base_files_validate_without_kubectl(path: Path, doc: dict):
    validate_core(doc)


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request) -> tuple[str, dict[str, dict]]:
    docs = kustomize(K8S / "overlays" / request.param)
    return request.param, {doc["kind"]: doc for doc in docs}


def test_each_overlay_renders_and_validates(rendered):
    overlay, docs = rendered
    assert set(docs) == KINDS, f"{overlay}: {sorted(docs)}"
    for doc in docs.values():
        validate_core(doc)


def test_selectors_and_targets_agree(rendered):
    _, docs = rendered
    deployment = docs["Deployment"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    assert docs["Service"]["spec"]["selector"].items() <= pod_labels.items()
    pdb = docs["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"]
    assert pdb and pdb.items() <= pod_labels.items()  # none: no pod protected; empty: every pod of the namespace
    target = docs["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    ports = {p["name"] for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert {p["targetPort"] for p in docs["Service"]["spec"]["ports"]} <= ports


def test_the_hpa_scales_on_queue_time_per_request_from_the_adapter_rule(rendered):
    _, docs = rendered
    metrics = docs["HorizontalPodAutoscaler"]["spec"]["metrics"]
    pods = next(m["pods"] for m in metrics if m["type"] == "Pods")
    (rule,) = yaml.safe_load(docs["ConfigMap"]["data"]["config.yaml"])["rules"]
    assert rule["name"]["as"] == pods["metric"]["name"] == "gebackend_queue_us_per_request"
    assert "nv_inference_queue_duration_us" in rule["seriesQuery"]
    query = rule["metricsQuery"]
    assert "rate(nv_inference_queue_duration_us" in query and "rate(nv_inference_request_success" in query
    assert query.index("nv_inference_queue_duration_us") < query.index("/") < query.index("nv_inference_request_success")
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}
    assert pods["target"]["type"] == "AverageValue"
    assert docs["HorizontalPodAutoscaler"]["spec"]["minReplicas"] >= 1


def test_the_pod_is_locked_down_probed_and_drained(rendered):
    overlay, docs = rendered
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsUser"] == 1000 and pod["securityContext"]["runAsNonRoot"] is True
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    args = serve_args_parse(container["args"])
    assert (args.http_port, args.grpc_port, args.metrics_port) == (8000, 8001, 8002)
    assert probe_window(container["startupProbe"]) >= args.startup_timeout
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod["terminationGracePeriodSeconds"] > pre_stop + args.exit_timeout + 3
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    resources = container["resources"]
    assert resources["requests"] == resources["limits"]  # Guaranteed QoS: exclusive cores with the static CPU manager
    annotations = docs["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == "8002"
    gpus = resources["limits"].get("nvidia.com/gpu")
    assert (gpus == "1") == (overlay == "gpu")


def test_a_broken_manifest_is_refused():
    deployment = next(d for _, d in base_documents() if d["kind"] == "Deployment")
    typo = copy.deepcopy(deployment)
    typo["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    with pytest.raises(AssertionError, match="readinessProbes"):
        validate_core(typo)
    wrong = copy.deepcopy(deployment)
    wrong["spec"]["replicas"] = "2"
    with pytest.raises(AssertionError):
        validate_core(wrong)
