"""Kubernetes pods as the spec's instances: the one definition of how a pod's own labels (the spec's
`kubernetes:` section) become the `topology`, `role`, `gpus`, `replica` and `job` labels.

`relabelings(spec, topology)` is a Prometheus relabel list; rules/render.py writes it into the
PodMonitor, the ServiceMonitor and the plain `kubernetes_sd_configs` job, and the exporter applies
the same list (`relabel`) to the discovered labels Prometheus's `/api/v1/targets` reports, so the
two can never disagree on which pod is what.

Kubernetes discovery exposes a pod label `k` as `__meta_kubernetes_pod_label_<k'>` and
`__meta_kubernetes_pod_labelpresent_<k'>` = "true", where k' is `k` with every character outside
[a-zA-Z0-9_] replaced by `_` (prometheus/prometheus discovery/kubernetes/kubernetes.go
addObjectAnnotationsAndLabels, util/strutil/strconv.go SanitizeLabelName; main of 2026-08-21,
v0.314.0-rc.0-200-gd15adb9ad7). The endpoints role (a ServiceMonitor's) sets the same pod labels for
targets backed by a pod. Labels starting with `__` are dropped after relabelling (scrape/target.go).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from crossover.errors import UserError
from crossover.spec import ENTRYPOINT_ROLE, FleetSpec, Role, Target, Topology

JOB_NAME = "vllm"  # the job label of every vLLM series (rules/model.py reads it from here)
POD_NAME = "__meta_kubernetes_pod_name"
POD_NAMESPACE = "__meta_kubernetes_namespace"
CONTAINER_PORT_NAME = "__meta_kubernetes_pod_container_port_name"
PD_ROLES = (Role.PREFILL.value, Role.DECODE.value, ENTRYPOINT_ROLE)  # what a P/D topology's pods may be
_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def sanitize(name: str) -> str:
    """Prometheus's strutil.SanitizeLabelName."""
    return _INVALID.sub("_", name)


def pod_label(key: str) -> str:
    return "__meta_kubernetes_pod_label_" + sanitize(key)


def pod_label_present(key: str) -> str:
    return "__meta_kubernetes_pod_labelpresent_" + sanitize(key)


@dataclass(frozen=True)
class Relabel:
    """One relabel_config; Prometheus's defaults where a field is None (separator ";", regex "(.*)",
    replacement "$1")."""

    action: str  # replace, keep or drop
    source_labels: tuple[str, ...] = ()
    regex: str | None = None
    target_label: str | None = None
    replacement: str | None = None

    def operator(self) -> dict[str, object]:
        """The Prometheus Operator's RelabelConfig spelling (sourceLabels, targetLabel)."""
        out: dict[str, object] = {}
        if self.source_labels:
            out["sourceLabels"] = list(self.source_labels)
        if self.regex is not None:
            out["regex"] = self.regex
        if self.target_label is not None:
            out["targetLabel"] = self.target_label
        if self.replacement is not None:
            out["replacement"] = self.replacement
        out["action"] = self.action
        return out

    def plain(self) -> dict[str, object]:
        """prometheus.yml's spelling (source_labels, target_label)."""
        names = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
        return {names.get(k, k): v for k, v in self.operator().items()}


def object_name(*parts: str) -> str:
    """A Kubernetes object name (a DNS subdomain: lowercase letters, digits, '-' and '.') from spec
    names, which may hold capitals and '_'."""
    return "-".join(parts).lower().replace("_", "-")[:253].strip("-.")


def _literal(value: str) -> str:
    """A label value as an RE2 pattern matching only itself (label values are [A-Za-z0-9-_.])."""
    return value.replace(".", r"\.")


def topology_values(spec: FleetSpec, topology: Topology) -> list[str]:
    """The topology_label values whose pods are this (listed) topology's."""
    mapped = spec.kubernetes.topology_values
    return sorted([v for v, name in mapped.items() if name == topology.name]
                  + ([topology.name] if topology.name not in mapped else []))


def pod_selector(spec: FleetSpec, topology: Topology) -> dict[str, object]:
    """A Kubernetes LabelSelector for the topology's pods (PodMonitor/ServiceMonitor `selector`)."""
    if topology.selector:
        return {"matchLabels": dict(sorted(topology.selector.items()))}
    label = spec.kubernetes.topology_label
    if label is None:
        raise UserError(f"topologies({topology.name}): on Kubernetes a topology needs a selector, or "
                        "kubernetes.topology_label naming the pod label that says its topology")
    return {"matchExpressions": [{"key": label, "operator": "In", "values": topology_values(spec, topology)}]}


def relabelings(spec: FleetSpec, topology: Topology) -> list[Relabel]:
    """Keep the topology's pods and give them the labels the rules and dashboards read."""
    k8s = spec.kubernetes
    out: list[Relabel] = []
    if topology.selector:
        keys = sorted(topology.selector)
        out.append(Relabel("keep", tuple(pod_label(k) for k in keys),
                           ";".join(_literal(topology.selector[k]) for k in keys)))
    else:
        pod_selector(spec, topology)  # the error when there is no way to find its pods
        assert k8s.topology_label is not None
        out.append(Relabel("keep", (pod_label(k8s.topology_label),),
                           "|".join(_literal(v) for v in topology_values(spec, topology))))
    if topology.disaggregated and k8s.role_label is not None:
        # A pod of a P/D topology that says no role would be counted as a third kind: leave it
        # unscraped (the exporter's discovery names it in an error, see pod_targets).
        out.append(Relabel("keep", (pod_label_present(k8s.role_label),), "true"))
    out.append(Relabel("replace", target_label="topology", replacement=topology.name))
    out.append(Relabel("replace", target_label="role", replacement=Role.COLOCATED.value))
    if topology.disaggregated and k8s.role_label is not None:
        # Only a P/D topology reads the role: llm-d labels the pods of a plain pool `decode` too.
        source = (pod_label(k8s.role_label),)
        out.append(Relabel("replace", source, "(.+)", "role", "$1"))
        for value, role in sorted(k8s.role_values.items()):
            out.append(Relabel("replace", source, _literal(value), "role", role))
        out.append(Relabel("keep", ("role",), "|".join(PD_ROLES)))
    out.append(Relabel("replace", target_label="gpus", replacement=str(topology.tensor_parallel_size)))
    for role, size in sorted(_role_tp_sizes(topology).items()):
        if size != topology.tensor_parallel_size:  # a P/D role on its own TP size (spec instances)
            out.append(Relabel("replace", ("role",), _literal(role), "gpus", str(size)))
    if k8s.tp_label is not None:
        out.append(Relabel("replace", (pod_label(k8s.tp_label),), "([1-9][0-9]*)", "gpus", "$1"))
    out.append(Relabel("replace", ("role",), ENTRYPOINT_ROLE, "gpus", "0"))
    out.append(Relabel("replace", (POD_NAME,), "(.+)", "replica", "$1"))
    out.append(Relabel("replace", target_label="job", replacement=JOB_NAME))
    return out


def _role_tp_sizes(topology: Topology) -> dict[str, int]:
    """Role -> the TP size all its listed instances share (roles whose instances differ are left to
    kubernetes.tp_label)."""
    sizes: dict[str, set[int]] = {}
    for instance in topology.instances:
        sizes.setdefault(instance.role.value, set()).add(topology.tp_of(instance))
    return {role: next(iter(found)) for role, found in sizes.items() if len(found) == 1}


def router_relabelings(spec: FleetSpec, topology: Topology) -> list[Relabel]:
    """Keep the pods of the topology's router (`entrypoint.selector`) and label them as its
    entrypoint: no GPUs, the pod name as replica. Empty when the router is not found on Kubernetes."""
    selector = topology.entrypoint.selector
    if not selector:
        return []
    keys = sorted(selector)
    return [Relabel("keep", tuple(pod_label(k) for k in keys), ";".join(_literal(selector[k]) for k in keys)),
            Relabel("replace", target_label="topology", replacement=topology.name),
            Relabel("replace", target_label="role", replacement=ENTRYPOINT_ROLE),
            Relabel("replace", target_label="gpus", replacement="0"),
            Relabel("replace", (POD_NAME,), "(.+)", "replica", "$1"),
            Relabel("replace", target_label="job", replacement=JOB_NAME)]


def _go_template(replacement: str, match: re.Match[str]) -> str:
    """Prometheus expands $1 / ${1} in a replacement (Go's Regexp.Expand)."""
    return re.sub(r"\$\{?(\d+)\}?", lambda m: match.group(int(m.group(1))) or "", replacement)


def relabel(labels: Mapping[str, str], rules: list[Relabel]) -> dict[str, str] | None:
    """Apply a relabel list as Prometheus does (actions replace, keep, drop; anchored regexes);
    None when the target is dropped."""
    out = dict(labels)
    for rule in rules:
        value = ";".join(out.get(name, "") for name in rule.source_labels)
        match = re.fullmatch(rule.regex if rule.regex is not None else "(.*)", value)
        if (rule.action == "keep" and match is None) or (rule.action == "drop" and match is not None):
            return None
        if rule.action == "replace" and match is not None and rule.target_label is not None:
            result = _go_template(rule.replacement if rule.replacement is not None else "$1", match)
            if result:
                out[rule.target_label] = result
            else:
                out.pop(rule.target_label, None)
    return out


def _router_target(spec: FleetSpec, labels: Mapping[str, str], url: str) -> Target | None:
    """The entrypoint target of the topology whose router pods (`entrypoint.selector`, on its metrics
    port) these discovered labels are, if any."""
    for topology in spec.topologies:
        entrypoint = topology.entrypoint
        if not entrypoint.selector or labels.get(CONTAINER_PORT_NAME, entrypoint.port) != entrypoint.port:
            continue
        final = relabel(labels, router_relabelings(spec, topology))
        if final is not None:
            return Target(topology.name, final["replica"], ENTRYPOINT_ROLE, url, 0, entrypoint.dialect,
                          tuple(entrypoint.split_by))
    return None


def pod_targets(spec: FleetSpec, discovered: list[tuple[Mapping[str, str], str]]
                ) -> tuple[list[Target], list[str]]:
    """Targets of the pods among `discovered` ((discovered labels, metrics URL) pairs, as Prometheus's
    target discovery reports them), and one line per pod that cannot be used: a pod of a P/D
    topology without the role label (named with the label), or a role value that is no role. The
    first topology whose relabelling keeps a pod has it."""
    k8s = spec.kubernetes
    out: list[Target] = []
    problems: list[str] = []
    seen: set[str] = set()
    for labels, url in discovered:
        if labels.get(POD_NAMESPACE, k8s.namespace) != k8s.namespace:
            continue
        router = _router_target(spec, labels, url)
        if router is not None:
            if url not in seen:
                seen.add(url)
                out.append(router)
            continue
        if labels.get(CONTAINER_PORT_NAME, k8s.ports[0]) not in k8s.ports:
            continue
        for topology in spec.topologies:
            if not topology.discovered and k8s.topology_label is None:
                continue
            rules = relabelings(spec, topology)
            kept = relabel(labels, rules[:1])  # the pod selection alone
            if kept is None:
                continue
            pod = f"{labels.get(POD_NAMESPACE, k8s.namespace)}/{labels.get(POD_NAME, url)}"
            if topology.disaggregated and k8s.role_label is not None and not labels.get(
                    pod_label_present(k8s.role_label)):
                problems.append(f"pod {pod} of P/D topology "
                                f"{topology.name} has no label {k8s.role_label} (prefill or decode)")
                break
            # The role's keep would drop the pod silently: check the role here and say why.
            final = relabel(labels, [r for r in rules if r.source_labels != ("role",) or r.action != "keep"])
            if final is None or url in seen:
                break
            role = final["role"]
            if topology.disaggregated and role not in PD_ROLES:
                problems.append(f"pod {pod} of P/D topology {topology.name}: label {k8s.role_label}="
                                f"{labels.get(pod_label(k8s.role_label or ''))!r} is not prefill or decode "
                                "(map it with kubernetes.role_values)")
                break
            seen.add(url)
            out.append(Target(topology.name, final["replica"], role, url, int(final["gpus"])))
            break
    return out, list(dict.fromkeys(problems))  # a pod seen by several jobs is said once
