"""How every rule reads vLLM's raw series: the configured selector (`--selector`), and which roles of
a topology stand for what its users see. The recording rules and the alerts read through this one
`RawSeries`, so a selector or a role choice is never spelled twice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from crossover import catalog, slo
from crossover.catalog import Metric
from crossover.rules.names import TOPOLOGY_BY, KvFamily
from crossover.spec import ENTRYPOINT_ROLE, REQUEST_SOURCES, Role

# A topology as its users see it (docs/routers.md): request families from its entrypoint targets,
# else from its decode role, else from its instances (colocated); never from both P/D roles.
# Generated tokens leave out the prefill role (its one token per request is no output), prompt
# tokens the decode role; nothing else is read from an entrypoint. The request outcome families
# (crossover.slo) follow the same choice, so a P/D request is never counted on both roles.
REQUEST_FAMILIES: frozenset[str] = frozenset(m.name for m in (*catalog.ENTRYPOINT_FAMILIES,
                                                              *slo.OUTCOME_FAMILIES))
ENTRYPOINT_MATCHER = f'role="{ENTRYPOINT_ROLE}"'
USER_SOURCES: tuple[tuple[str, str], ...] = tuple(zip(REQUEST_SOURCES, (
    ENTRYPOINT_MATCHER,
    f'role="{Role.DECODE.value}"',
    f'role!~"{ENTRYPOINT_ROLE}|{Role.PREFILL.value}|{Role.DECODE.value}"'), strict=True))
TOPOLOGY_ROLES: dict[str, str] = {
    catalog.GENERATION_TOKENS.name: f'role!~"{ENTRYPOINT_ROLE}|{Role.PREFILL.value}"',
    catalog.PROMPT_TOKENS.name: f'role!~"{ENTRYPOINT_ROLE}|{Role.DECODE.value}"',
}
NOT_ENTRYPOINT = f'role!="{ENTRYPOINT_ROLE}"'


def promql_string(value: str) -> str:
    """A PromQL string literal (double-quoted, backslashes and quotes escaped)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def label_list(labels: tuple[str, ...]) -> str:
    """The labels of a `sum by (...)` or an `on (...)`."""
    return ", ".join(labels)


@dataclass(frozen=True)
class RawSeries:
    """Selectors of the raw series, each with the configured matchers (`selector`)."""

    selector: str  # PromQL matchers every raw vLLM series is read with (RulesConfig.selector)

    def sel(self, name: str, extra: str = "", first: str = "") -> str:
        """`name{first,selector,extra}`: the configured selector between the given matchers."""
        matchers = ",".join(m for m in (first, self.selector.strip(), extra) if m)
        return f"{name}{{{matchers}}}"

    def raw(self, family: Metric | KvFamily, suffix: str | None = None, extra: str = "",
            role: str = "") -> str:
        """A selector of a family's raw samples: `suffix` `_bucket`, `_sum` or `_count`, or None for
        a counter's or gauge's PromQL name; `role` a matcher on the scrape config's role label."""
        if isinstance(family, KvFamily):
            return self.sel("", ",".join(m for m in (f'__name__=~"{family.names(suffix)}"', extra) if m))
        name = family.promql_name if suffix is None else family.name + suffix
        return self.sel(name, extra, first=role)

    def summed_rate(self, family: Metric | KvFamily, window: str, by: tuple[str, ...] = TOPOLOGY_BY,
                    suffix: str | None = None, extra: str = "") -> str:
        """Summed rate of a family's raw samples (`raw`). Per topology (no role in `by`) the roles are
        picked as the topology's users see it: see REQUEST_FAMILIES and TOPOLOGY_ROLES."""
        def summed(role: str = "") -> str:
            return f"sum by ({label_list(by)}) (rate({self.raw(family, suffix, extra, role)}[{window}]))"

        if "role" in by or isinstance(family, KvFamily):
            return summed()
        if family.name in REQUEST_FAMILIES:  # parenthesised: callers divide and multiply it
            choices = "\n  or on (topology)\n  ".join(summed(role) for _, role in USER_SOURCES)
            return f"(\n  {choices}\n)"
        return summed(TOPOLOGY_ROLES.get(family.name, NOT_ENTRYPOINT))

    def entrypoint_request_series(self) -> str:
        """The entrypoint targets' series that show they expose the request families
        (catalog.ENTRYPOINT_FAMILIES): without them a topology's request figures fall back to decode."""
        families = promql_string("|".join(re.escape(m.presence_name) for m in catalog.ENTRYPOINT_FAMILIES))
        return self.sel("", f"__name__=~{families},{ENTRYPOINT_MATCHER}")

    def vllm_up(self) -> str:
        """`up` of the vLLM instances; an entrypoint serves no engine families."""
        return self.sel("up", NOT_ENTRYPOINT)
