"""Offline validation of Kubernetes manifests against the schemas vendored in
tests/fixtures/schemas/ (README.md there says where each comes from): the CRDs' openAPIV3Schema
for the Prometheus and Grafana Operators' kinds, the Kubernetes OpenAPI for ConfigMap.

As `kubectl apply` with its default strict field validation would: an unknown field is an error
(every object schema without additionalProperties or x-kubernetes-preserve-unknown-fields gets
additionalProperties: false), metadata is checked against ObjectMeta, and names, namespaces and
label keys and values against apimachinery's rules (which no schema states).
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

import jsonschema
import yaml

from tests.helpers import FIXTURES

SCHEMAS = FIXTURES / "schemas"
KINDS = {
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitors.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitors.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrules.json",
    ("grafana.integreatly.org/v1beta1", "GrafanaDashboard"): "grafanadashboards.json",
    ("v1", "ConfigMap"): "configmap.json",
}
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")


def _strict(node: Any) -> Any:
    if isinstance(node, dict):
        out = {k: _strict(v) for k, v in node.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


@functools.cache
def _validator(file_name: str) -> jsonschema.protocols.Validator:
    schema = _strict(json.loads((SCHEMAS / file_name).read_text()))
    schema.pop("$schema", None)  # the CRDs' OpenAPI subset reads the same under draft 2020-12
    return jsonschema.Draft202012Validator(schema)


@functools.cache
def _object_meta() -> jsonschema.protocols.Validator:
    meta = _strict(json.loads((SCHEMAS / "configmap.json").read_text()))["properties"]["metadata"]
    return jsonschema.Draft202012Validator({**meta, "required": ["name"]})


def _label_key(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    return bool(_LABEL_NAME.match(name)) and (not prefix or (len(prefix) <= 253
                                                            and bool(_DNS_SUBDOMAIN.match(prefix))))


def problems(doc: Any) -> list[str]:
    """Every reason the API server would refuse this object, as `path: message` lines."""
    if not isinstance(doc, dict):
        return [f"not an object: {doc!r:.60}"]
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key not in KINDS:
        return [f"no vendored schema for apiVersion {key[0]!r} kind {key[1]!r}"]
    found = [f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
             for e in _validator(KINDS[key]).iter_errors(doc)]
    metadata = doc.get("metadata")
    found += [f"metadata.{'.'.join(map(str, e.absolute_path))}: {e.message}"
              for e in _object_meta().iter_errors(metadata)]
    if isinstance(metadata, dict):
        name, namespace = metadata.get("name", ""), metadata.get("namespace")
        if not (isinstance(name, str) and len(name) <= 253 and _DNS_SUBDOMAIN.match(name)):
            found.append(f"metadata.name: {name!r} is not a DNS subdomain")
        if namespace is not None and not (isinstance(namespace, str) and _DNS_LABEL.match(namespace)):
            found.append(f"metadata.namespace: {namespace!r} is not a DNS label")
        for label, value in (metadata.get("labels") or {}).items():
            if not _label_key(str(label)):
                found.append(f"metadata.labels: {label!r} is not a label key")
            if not (isinstance(value, str) and _LABEL_VALUE.match(value)):
                found.append(f"metadata.labels.{label}: {value!r} is not a label value")
        for annotation in metadata.get("annotations") or {}:
            if not _label_key(str(annotation)):
                found.append(f"metadata.annotations: {annotation!r} is not an annotation key")
    if key == ("v1", "ConfigMap"):
        size = len(json.dumps(doc.get("data") or {}))
        if size > 1024 * 1024:  # etcd's object limit; the sidecar reads data keys as file names
            found.append(f"data: {size} bytes, over the 1 MiB a ConfigMap may hold")
    return found


def manifest_problems(text: str) -> list[str]:
    """problems() of every document of a YAML file (kubectl apply reads each `---` document)."""
    out = []
    for index, doc in enumerate(d for d in yaml.safe_load_all(text) if d is not None):
        name = (doc.get("metadata") or {}).get("name") if isinstance(doc, dict) else None
        out += [f"document {index} ({name}): {p}" for p in problems(doc)]
    return out
