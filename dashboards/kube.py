"""The dashboards as Kubernetes objects, for the two ways clusters load them (docs/kubernetes.md):

- a ConfigMap per dashboard for the Grafana sidecar of kube-prometheus-stack (kiwigrid/k8s-sidecar
  watches ConfigMaps carrying the label its chart configures, grafana_dashboard: "1" in
  kube-prometheus-stack 88.5.3's values.yaml, and writes each into the sub-folder named by its
  folder annotation, k8s-sidecar-target-directory unless the chart's folderAnnotation says otherwise);
- a Grafana Operator GrafanaDashboard (grafana.integreatly.org/v1beta1, CRD of grafana-operator
  v5.24.0: spec.instanceSelector picks the Grafana instances, spec.json holds the model,
  spec.folder the folder title).

Both come from the spec's kubernetes.dashboards section and go into the folder of the PrometheusRule
and PodMonitors, so one `kubectl apply -f DIR` sets a cluster up.
"""

from __future__ import annotations

from typing import Any

from crossover.kube import object_name
from crossover.rules.render import dump, header
from crossover.spec import FleetSpec

CONFIGMAPS_FILE = "grafana-dashboards-configmaps.yaml"
GRAFANA_DASHBOARDS_FILE = "grafana-dashboards.yaml"
OPERATOR_API = "grafana.integreatly.org/v1beta1"
COMMAND = "python -m crossover.dashboards.generate"


def _metadata(spec: FleetSpec, stem: str, file_name: str) -> dict[str, Any]:
    return {"name": object_name("vllm-crossover", stem, file_name.removesuffix(".json")),
            "namespace": spec.kubernetes.dashboards_namespace,
            "labels": {"app.kubernetes.io/name": "vllm-crossover",
                       "app.kubernetes.io/component": "dashboards"}}


def configmaps(spec: FleetSpec, stem: str, files: dict[str, str]) -> list[dict[str, Any]]:
    config = spec.kubernetes.dashboards
    out = []
    for name, text in files.items():
        metadata = _metadata(spec, stem, name)
        metadata["labels"].update(config.sidecar_labels)
        metadata["annotations"] = {config.folder_annotation: config.folder}
        # The sidecar writes each data key as a file: prefix the spec's stem so two specs' overlay
        # dashboards do not overwrite each other in Grafana's folder.
        out.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata,
                    "data": {f"{stem}-{name}": text}})
    return out


def grafana_dashboards(spec: FleetSpec, stem: str, files: dict[str, str]) -> list[dict[str, Any]]:
    config = spec.kubernetes.dashboards
    return [{"apiVersion": OPERATOR_API, "kind": "GrafanaDashboard", "metadata": _metadata(spec, stem, name),
             "spec": {"instanceSelector": {"matchLabels": dict(config.instance_selector)},
                      # The Grafana instance usually lives in another namespace than the fleet.
                      "allowCrossNamespaceImport": True,
                      "folder": config.folder, "json": text}}
            for name, text in files.items()]


def kubernetes_files(spec: FleetSpec, stem: str, files: dict[str, str], source: str) -> dict[str, str]:
    """File name -> multi-document YAML of the dashboards (name -> JSON text) as both objects."""
    def documents(resources: list[dict[str, Any]]) -> str:
        return header(source, COMMAND) + "---\n".join(dump(r) for r in resources)
    return {CONFIGMAPS_FILE: documents(configmaps(spec, stem, files)),
            GRAFANA_DASHBOARDS_FILE: documents(grafana_dashboards(spec, stem, files))}
