"""The layouts a GPU budget admits: tensor-parallel size by memory fit, replicas, and P/D xPyD with
each role's own TP size; each as a spec Topology the simulator runs and a fleet spec a user deploys.

Memory fit is vLLM's start-up check: a shard's weights plus the KV cache of one request of
`max_model_len` tokens must fit the memory vLLM may use (memory_gib x gpu_memory_utilization);
activations and CUDA graphs are not counted (docs/capacity.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from crossover.errors import UserError
from crossover.spec import Balance, Entrypoint, FleetSpec, Instance, Role, Topology

_GIB = 1024**3


@dataclass(frozen=True)
class Layout:
    """Colocated: `replicas` instances of TP `tp`. P/D: `replicas` prefill instances of TP `tp` and
    `decodes` decode instances of TP `decode_tp`."""

    tp: int
    replicas: int
    decode_tp: int = 0
    decodes: int = 0

    @property
    def disaggregated(self) -> bool:
        return self.decodes > 0

    @property
    def gpus(self) -> int:
        return self.tp * self.replicas + self.decode_tp * self.decodes

    @property
    def name(self) -> str:
        if not self.disaggregated:
            return f"tp{self.tp}x{self.replicas}"
        return f"pd{self.replicas}p-tp{self.tp}-{self.decodes}d-tp{self.decode_tp}"

    @property
    def label(self) -> str:
        """How the table says it: TP=4x1, or 1P(TP=2)+1D(TP=2)."""
        if not self.disaggregated:
            return f"TP={self.tp}x{self.replicas}"
        return f"{self.replicas}P(TP={self.tp})+{self.decodes}D(TP={self.decode_tp})"

    def topology(self, port: int = 8100) -> Topology:
        """The layout as a spec topology: loopback URLs from `port` on (placeholders to fill in)."""
        roles = [(Role.PREFILL if self.disaggregated else Role.COLOCATED, self.tp, self.replicas)]
        if self.disaggregated:
            roles.append((Role.DECODE, self.decode_tp, self.decodes))
        instances = []
        for role, tp, count in roles:
            for n in range(count):
                prefix = {Role.PREFILL: "prefill", Role.DECODE: "decode"}.get(role, f"tp{tp}")
                instances.append(
                    Instance(
                        name=f"{self.name}-{prefix}-{n}",
                        url=f"http://127.0.0.1:{port}",
                        role=role,
                        tensor_parallel_size=tp if self.disaggregated else None,
                    )
                )
                port += 1
        entrypoint = (
            Entrypoint(url=f"http://127.0.0.1:{port}", metrics_url=f"http://127.0.0.1:{port}/metrics")
            if self.disaggregated
            else Entrypoint(balance=Balance.LEAST_OUTSTANDING)
        )
        return Topology(
            name=self.name,
            gpus=self.gpus,
            tensor_parallel_size=self.tp,
            instances=instances,
            entrypoint=entrypoint,
        )


def layout_of(topology: Topology) -> Layout:
    """A spec topology as a Layout (the spec's own topologies searched as they are)."""
    prefill = [topology.tp_of(i) for i in topology.instances if i.role is Role.PREFILL]
    decode = [topology.tp_of(i) for i in topology.instances if i.role is Role.DECODE]
    if not prefill:
        sizes = topology.tp_sizes
        if len(sizes) > 1:
            raise UserError(
                f"topology {topology.name}: colocated instances of different TP sizes "
                f"{sizes} are not a layout the planner models"
            )
        return Layout(sizes[0], len(topology.instances))
    if len(set(prefill)) > 1 or len(set(decode)) > 1:
        raise UserError(f"topology {topology.name}: one TP size per role, please")
    return Layout(prefill[0], len(prefill), decode[0], len(decode))


@dataclass(frozen=True)
class Fit:
    """What one GPU must hold at a TP size, and what it has."""

    tp: int
    weights_gib: float  # per GPU
    min_kv_gib: float  # per GPU: one max_model_len request's KV, sharded
    usable_gib: float  # memory_gib x gpu_memory_utilization

    @property
    def needed_gib(self) -> float:
        return self.weights_gib + self.min_kv_gib

    @property
    def fits(self) -> bool:
        return self.needed_gib < self.usable_gib


def tp_candidates(spec: FleetSpec, gpus: int) -> list[int]:
    """TP sizes vLLM accepts for the model up to the budget: they divide the attention heads, and
    the KV heads divide them or they divide the KV heads (replicated KV heads)."""
    model = spec.model
    return [
        tp
        for tp in range(1, gpus + 1)
        if model.heads % tp == 0 and (model.kv_heads % tp == 0 or tp % model.kv_heads == 0)
    ]


def fit(spec: FleetSpec, tp: int) -> Fit:
    model = spec.model
    return Fit(
        tp,
        model.weight_bytes / tp / _GIB,
        model.max_model_len * model.kv_bytes_per_token / tp / _GIB,
        spec.hardware.memory_gib * spec.hardware.gpu_memory_utilization,
    )


@dataclass(frozen=True)
class Space:
    """What the search may try (flags; the spec's own topologies are another way to fix it)."""

    tp: tuple[int, ...] | None = None  # only these TP sizes (None: every candidate that fits)
    colocated: bool = True
    disaggregated: bool = True
    max_instances: int = 16  # per layout: keeps a large budget's P/D mixes countable


def enumerate_layouts(spec: FleetSpec, gpus: int, space: Space = Space()) -> tuple[list[Layout], list[Fit]]:
    """Every layout using exactly `gpus` GPUs, and the fit of each candidate TP size. UserError when
    the model fits no TP size of the budget, or when no layout uses the whole budget."""
    if gpus < 1:
        raise UserError(f"--gpus: must be at least 1, got {gpus}")
    candidates = tp_candidates(spec, gpus)
    if space.tp is not None:
        candidates = [tp for tp in candidates if tp in space.tp]
        if not candidates:
            raise UserError(
                f"--tp: none of {list(space.tp)} is a TP size {spec.model.name} allows on "
                f"{gpus} GPUs (heads {spec.model.heads}, kv_heads {spec.model.kv_heads})"
            )
    fits = [fit(spec, tp) for tp in candidates]
    sizes = [f.tp for f in fits if f.fits]
    if not sizes:
        largest = fits[-1] if fits else fit(spec, gpus)
        raise UserError(
            f"{spec.model.name} fits no layout of {gpus} GPU(s): it needs {largest.needed_gib:.1f} GiB "
            f"per GPU at TP {largest.tp} ({largest.weights_gib:.1f} GiB of weights + "
            f"{largest.min_kv_gib:.1f} GiB of KV for one {spec.model.max_model_len}-token request), "
            f"a {spec.hardware.gpu} has "
            f"{largest.usable_gib:.1f} GiB usable (memory_gib x gpu_memory_utilization)"
        )
    layouts: list[Layout] = []
    if space.colocated:
        layouts += [
            Layout(tp, gpus // tp) for tp in sizes if gpus % tp == 0 and gpus // tp <= space.max_instances
        ]
    if space.disaggregated:
        for tp in sizes:
            for decode_tp in sizes:
                for prefills in range(1, gpus // tp + 1):
                    rest = gpus - prefills * tp
                    if rest < decode_tp or rest % decode_tp:
                        continue
                    layout = Layout(tp, prefills, decode_tp, rest // decode_tp)
                    if prefills + layout.decodes <= space.max_instances:
                        layouts.append(layout)
    if not layouts:
        smallest = sizes[0]
        counts = sorted({n for n in range(smallest, 4 * max(gpus, smallest) + 1) if n % smallest == 0})[:6]
        raise UserError(
            f"--gpus {gpus}: no layout uses all {gpus} GPUs (the model fits TP sizes {sizes}); "
            f"budgets that one does: {', '.join(map(str, counts))}"
        )
    return layouts, fits
