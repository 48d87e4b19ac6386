"""Reads deploy/ manifests and validates them offline: custom resources against the openAPIV3Schema of their CRD
(KServe's, read as data from ../shared/kserve-crds/ beside the repository), core kinds with kubernetes-validate.

Validation is strict, as `kubectl apply --validate=strict` is: a field the schema does not know is an error (the
API server would drop it silently otherwise), except below `x-kubernetes-preserve-unknown-fields`.
"""

from __future__ import annotations

import argparse
import functools
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterator

import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CRDS = ROOT.parent / "shared" / "kserve-crds"
KUBERNETES_VERSIONS = ("1.31.0", "1.37.0")  # the oldest we claim (PDB unhealthyPodEvictionPolicy is GA in 1.31) and the newest schema
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRDs are 2 MB of YAML


def load_all(path: Path) -> list[dict]:
    return [doc for doc in yaml.load_all(path.read_text(), Loader=_LOADER) if doc]


@functools.lru_cache(maxsize=None)
def crd_schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> openAPIV3Schema, for every CRD in ../shared/kserve-crds/."""
    if not CRDS.is_dir():
        pytest.fail(f"the KServe CRD schemas are missing: expected {CRDS} (the shared/ folder beside this repository, "
                    f"with serving.kserve.io_*.yaml from KServe's charts/kserve-crd)")
    schemas = {}
    for path in sorted(CRDS.glob("*.yaml")):
        for doc in load_all(path):
            if doc.get("kind") != "CustomResourceDefinition":
                continue
            group, kind = doc["spec"]["group"], doc["spec"]["names"]["kind"]
            for version in doc["spec"]["versions"]:
                schemas[(f"{group}/{version['name']}", kind)] = version["schema"]["openAPIV3Schema"]
    if not schemas:
        pytest.fail(f"no CustomResourceDefinition in {CRDS}")
    return schemas


def unknown_fields(instance: Any, schema: dict, path: str = "") -> Iterator[str]:
    """Fields of `instance` that `schema` does not declare (structural schemas: properties, items,
    additionalProperties, x-kubernetes-preserve-unknown-fields)."""
    if not isinstance(schema, dict) or schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    if isinstance(instance, dict):
        properties = schema.get("properties")
        additional = schema.get("additionalProperties")
        for key, value in instance.items():
            where = f"{path}.{key}" if path else key
            if properties is not None and key in properties:
                yield from unknown_fields(value, properties[key], where)
            elif isinstance(additional, dict):
                yield from unknown_fields(value, additional, where)
            elif properties is not None and additional is not True and not (path == "" and key in ("apiVersion", "kind", "metadata")):
                yield where
    elif isinstance(instance, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(instance):
            yield from unknown_fields(item, schema["items"], f"{path}[{i}]")


def validate_custom(doc: dict) -> None:
    key = (doc.get("apiVersion"), doc.get("kind"))
    schema = crd_schemas().get(key)
    assert schema is not None, f"no CRD for {key} in {CRDS}"
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(doc), key=lambda e: list(e.absolute_path))
    assert not errors, f"{key} {doc['metadata'].get('name')}: " + "; ".join(
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in errors[:10])
    unknown = list(unknown_fields(doc, schema))
    assert not unknown, f"{key} {doc['metadata'].get('name')}: fields the CRD does not know: {unknown}"
    validate_metadata(doc)


def validate_core(doc: dict) -> None:
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{doc['kind']} {doc['metadata'].get('name')} (Kubernetes {version}): "
                                 f"{'.'.join(map(str, exc.path))}: {exc.message}") from None
    validate_metadata(doc)


def validate_metadata(doc: dict) -> None:
    name = doc["metadata"]["name"]
    assert DNS_LABEL.match(name) and len(name) <= 63, f"{doc['kind']} name {name!r} is not a DNS-1123 label"


def serve_args_parse(args: list[str]) -> argparse.Namespace:
    """Parse container args as the image's entrypoint (`gebackend serve`) would, with the real parser."""
    from gebackend.cli.main import build_parser

    parser = build_parser()
    try:
        return parser.parse_args(["serve", *args])
    except SystemExit as exc:
        raise AssertionError(f"`gebackend serve {' '.join(args)}` does not parse (exit {exc.code})") from None


def kustomize(path: Path) -> list[dict]:
    """`kubectl kustomize PATH`, skipping with the reason when kubectl is not on PATH."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not on PATH: `make deploy-tools` installs it (with podman, buildah, debootstrap)")
    version = kustomize_version(kubectl)
    if version is not None and version < (4, 2):
        pytest.skip(f"{kubectl}'s kustomize is v{'.'.join(map(str, version))}; deploy/k8s needs kustomize v4.2 or newer "
                    f"(kubectl 1.22+: `labels`, inline `patches`)")
    result = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"kubectl kustomize {path} failed: {result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def kustomize_version(kubectl: str) -> tuple[int, ...] | None:
    """The kustomize version kubectl bundles, e.g. (5, 5, 0); None when it does not say."""
    import json

    try:
        out = subprocess.run([kubectl, "version", "--client", "-o", "json"], capture_output=True, text=True, timeout=30).stdout
        text = json.loads(out).get("kustomizeVersion", "")
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None
    match = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(g) for g in match.groups() if g is not None) if match else None


def probe_window(probe: dict) -> int:
    """Seconds a probe allows before it gives up: periodSeconds x failureThreshold (+ initialDelaySeconds)."""
    return probe.get("initialDelaySeconds", 0) + probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)
