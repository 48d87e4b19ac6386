"""deploy/kserve/: the ClusterServingRuntimes and InferenceServices against KServe's CRD schemas (read from
../shared/kserve-crds/), and what the ge runtime promises: KServe's ports, model formats and protocols, the
locked-down container, probes that fit model loading, and args the image's `gebackend serve` accepts."""

from __future__ import annotations

from pathlib import Path

import pytest

import copy

from .manifests import DEPLOY, ROOT, load_all, probe_window, serve_args_parse, validate_custom

pytestmark = pytest.mark.deploy

KSERVE = DEPLOY / "kserve"
EXAMPLES = ROOT / "examples" / "model_repository"
STARTUP_TIMEOUT = 300  # gebackend serve --startup-timeout default: the CLI gives up on tritonserver after this


def documents() -> list[tuple[Path, dict]]:
    return [(path, doc) for path in sorted(KSERVE.glob("*.yaml")) for doc in load_all(path)]


def by_kind(kind: str) -> list[dict]:
    return [doc for _, doc in documents() if doc["kind"] == kind]


def runtime(name: str) -> dict:
    return next(doc for doc in by_kind("ClusterServingRuntime") if doc["metadata"]["name"] == name)


@pytest.mark.parametrize("path,doc", [pytest.param(p, d, id=f"{p.name}:{d['kind']}:{d['metadata']['name']}")
                                      for p, d in documents() if d["kind"] != "TrainedModel"])
def test_every_manifest_validates_against_its_crd(path: Path, doc: dict):
    validate_custom(doc)


def test_the_runtime_serves_ge_and_onnx_on_kserves_ports():
    spec = runtime("kserve-gebackend")["spec"]
    formats = {f["name"]: f for f in spec["supportedModelFormats"]}
    assert set(formats) == {"ge", "onnx"}
    assert formats["ge"]["autoSelect"] and not formats["onnx"]["autoSelect"]
    assert spec["protocolVersions"] == ["v2", "grpc-v2"]
    assert spec["annotations"]["prometheus.kserve.io/port"] == "8002"
    assert spec["annotations"]["prometheus.kserve.io/path"] == "/metrics"
    (container,) = spec["containers"]
    assert container["name"] == "kserve-container"
    args = serve_args_parse(container["args"])
    assert (args.http_port, args.grpc_port, args.metrics_port) == (8080, 9000, 8002)
    assert args.model_repository == Path("/mnt/models")
    assert not args.allow_model_control


@pytest.mark.parametrize("name", ["kserve-gebackend", "kserve-gebackend-multimodel"])
def test_the_container_is_locked_down_and_sized(name: str):
    spec = runtime(name)["spec"]
    (container,) = spec["containers"]
    security = container["securityContext"]
    assert security["runAsUser"] == 1000 and security["runAsNonRoot"] is True
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"] and "add" not in security["capabilities"]
    resources = container["resources"]
    for key in ("cpu", "memory"):
        assert key in resources["requests"] and key in resources["limits"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    assert "sizeLimit" in volumes[mounts["/dev/shm"]]["emptyDir"]
    assert "emptyDir" in volumes[mounts["/tmp"]]  # the server's temp folder: a writable one that allows exec


@pytest.mark.parametrize("name", ["kserve-gebackend", "kserve-gebackend-multimodel"])
def test_probes_use_tritons_health_endpoints_with_a_window_for_loading(name: str):
    (container,) = runtime(name)["spec"]["containers"]
    startup, ready, live = container["startupProbe"], container["readinessProbe"], container["livenessProbe"]
    assert startup["httpGet"] == {"path": "/v2/health/ready", "port": 8080}
    assert ready["httpGet"] == {"path": "/v2/health/ready", "port": 8080}
    assert live["httpGet"] == {"path": "/v2/health/live", "port": 8080}
    # the startup window covers the CLI's own start-up timeout (large models compiled static take a minute or more to
    # load: docs/deploy.md, Probes)
    assert probe_window(startup) >= STARTUP_TIMEOUT
    # a tritonserver restart (gebackend restarts a crashed one, then its models load again) is not a dead pod
    assert probe_window(live) >= 120


def test_the_multimodel_runtime_lets_kserves_agent_load_models():
    spec = runtime("kserve-gebackend-multimodel")["spec"]
    assert spec["multiModel"] is True
    (container,) = spec["containers"]
    args = serve_args_parse(container["args"])
    assert args.allow_model_control
    assert (args.http_port, args.grpc_port) == (8080, 9000)


def test_every_example_model_has_an_inferenceservice():
    examples = sorted(p.parent.name for p in EXAMPLES.glob("*/config.pbtxt"))
    services = {doc["metadata"]["name"]: doc for doc in by_kind("InferenceService")}
    for model in examples:
        service = services.get(model.replace("_", "-"))
        assert service is not None, f"no InferenceService for example {model} in {KSERVE}"
        predictor = service["spec"]["predictor"]
        spec = predictor["model"]
        assert spec["runtime"] == "kserve-gebackend" and spec["modelFormat"]["name"] == "ge"
        assert spec["storageUri"].rstrip("/").endswith(f"/{model}")
        assert spec["protocolVersion"] in ("v2", "grpc-v2")
        if spec["protocolVersion"] == "grpc-v2":  # KServe's gRPC port is named h2c
            assert {"name": "h2c", "containerPort": 9000, "protocol": "TCP"} in spec["ports"]
        # the drain (--exit-timeout 30) ends before Kubernetes' SIGKILL
        assert predictor["terminationGracePeriodSeconds"] > 30 + 5


def test_trained_models_point_at_the_multimodel_service():
    """TrainedModel's CRD is not among ../shared/kserve-crds/: its fields are checked as KServe's agent reads them."""
    services = {doc["metadata"]["name"]: doc for doc in by_kind("InferenceService")}
    models = by_kind("TrainedModel")
    assert len(models) == 3
    formats = {f["name"] for f in runtime("kserve-gebackend-multimodel")["spec"]["supportedModelFormats"]}
    for model in models:
        assert model["apiVersion"] == "serving.kserve.io/v1alpha1"
        assert set(model["spec"]) == {"inferenceService", "model"}
        assert set(model["spec"]["model"]) == {"framework", "storageUri", "memory"}
        service = services[model["spec"]["inferenceService"]]
        assert service["spec"]["predictor"]["model"]["runtime"] == "kserve-gebackend-multimodel"
        assert "storageUri" not in service["spec"]["predictor"]["model"]
        assert model["spec"]["model"]["framework"] in formats
        # the TrainedModel's name is the Triton model's (its folder): a config.pbtxt `name:` must match or be absent
        folder = model["spec"]["model"]["storageUri"].rstrip("/").rsplit("/", 1)[1]
        assert (EXAMPLES / folder / "config.pbtxt").is_file()


def test_the_validation_catches_what_the_api_server_would_refuse_or_drop():
    """The check itself: a wrong type, a typo'd field (pruned silently by the API server), a bad name."""
    good = runtime("kserve-gebackend")
    wrong_type = copy.deepcopy(good)
    wrong_type["spec"]["containers"][0]["startupProbe"]["failureThreshold"] = "60"
    typo = copy.deepcopy(good)
    typo["spec"]["containers"][0]["securityContext"]["readOnlyRootFileSystem"] = True
    top_typo = copy.deepcopy(good)
    top_typo["spec"]["protocolVersion"] = ["v2"]
    bad_name = copy.deepcopy(good)
    bad_name["metadata"]["name"] = "kserve_gebackend"
    for broken, expected in ((wrong_type, "is not of type"), (typo, "readOnlyRootFileSystem"),
                             (top_typo, "spec.protocolVersion"), (bad_name, "DNS-1123")):
        with pytest.raises(AssertionError, match=expected):
            validate_custom(broken)
    service = copy.deepcopy(by_kind("InferenceService")[0])
    service["spec"]["predictor"]["model"]["storageURI"] = "s3://x"
    with pytest.raises(AssertionError, match="storageURI"):
        validate_custom(service)
