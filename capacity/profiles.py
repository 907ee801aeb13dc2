"""Hardware profiles: a spec's hardware block and performance-model knobs, with the step-time error
measured for them (docs/simulator.md's tables) and the terms that are assumed, not measured.

A profile is data: a YAML file in capacity/profiles/ (shipped) or the user's own (`--profile
FILE`). Adding one (the measured H100 profile) is adding a file.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from crossover.errors import UserError
from crossover.spec import FleetSpec, Hardware, Simulator, SpecError, parse_spec

SPEC_PROFILE = "spec"  # the spec's own hardware block and knobs
# The band of a profile whose step times were never compared with a GPU's (the spec's own, unless it
# is a shipped profile's hardware): the shipped profiles' worst cell, said as assumed in the output.
UNMEASURED_STEP_ERROR = 0.10


# The simulator knobs that shape step times (a profile's `simulator:` sets some of them).
_MODEL_KNOBS = (
    "hbm_efficiency",
    "mfu",
    "gpu_time_scale",
    "host_overhead_step_us",
    "host_overhead_per_seq_us",
    "host_overhead_per_seq_per_rank_us",
)


@dataclass(frozen=True)
class Profile:
    name: str
    source: str
    step_error: float  # mean |step-time error|: the band every figure carries
    worst_step_error: float
    measured: bool
    assumed: tuple[str, ...]
    hardware: dict[str, Any]
    simulator: dict[str, Any]

    def apply(self, spec: FleetSpec) -> FleetSpec:
        """The spec on this profile's hardware (the spec's own profile: the spec as it is)."""
        if self.name == SPEC_PROFILE:
            return spec
        data = spec.model_dump(mode="json", exclude_none=True)
        data["hardware"] = dict(self.hardware)
        data["simulator"] = {**data["simulator"], **self.simulator}
        try:
            return parse_spec(data, f"profile {self.name}")
        except SpecError as exc:
            raise UserError(str(exc)) from None


def _shipped_files() -> dict[str, Any]:
    folder = resources.files("crossover.capacity") / "profiles"
    return {
        entry.name.removesuffix(".yaml"): entry for entry in folder.iterdir() if entry.name.endswith(".yaml")
    }


def shipped() -> list[str]:
    return sorted(_shipped_files())


def _from_data(data: Any, where: str) -> Profile:
    if not isinstance(data, dict) or not isinstance(data.get("hardware"), dict):
        raise UserError(f"{where}: a profile is a mapping with name, hardware, step_time_error")
    error = data.get("step_time_error") or {}
    try:
        mean = float(error.get("mean", UNMEASURED_STEP_ERROR))
        worst = float(error.get("worst", mean))
    except (TypeError, ValueError, AttributeError):
        raise UserError(f"{where}: step_time_error: want {{mean: 0.03, worst: 0.10}}") from None
    if not 0 <= mean < 1 or not 0 <= worst < 1:
        raise UserError(f"{where}: step_time_error: shares between 0 and 1, got mean {mean}, worst {worst}")
    return Profile(
        str(data.get("name", where)),
        str(data.get("source", where)),
        mean,
        worst,
        bool(data.get("measured", False)),
        tuple(str(a) for a in data.get("assumed", ())),
        dict(data["hardware"]),
        dict(data.get("simulator") or {}),
    )


def load(name: str) -> Profile:
    """A shipped profile by name, or a profile YAML file."""
    files = _shipped_files()
    if name in files:
        return _from_data(yaml.safe_load(files[name].read_text()), f"profile {name}")
    path = Path(name)
    if not path.is_file():
        raise UserError(
            f"--profile: {name!r} is neither a shipped profile ({', '.join(sorted(files))}, "
            f"{SPEC_PROFILE}) nor a profile file"
        )
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise UserError(f"--profile {name}: cannot read: {str(exc).splitlines()[0]}") from None
    return _from_data(data, name)


def of_spec(spec: FleetSpec, step_error: float | None = None) -> Profile:
    """The spec's own hardware as a profile: a shipped profile's band where the spec's hardware and
    knobs are that profile's, else `step_error` or the unmeasured default, said as assumed."""
    hardware = spec.hardware.model_dump(mode="json", exclude_none=True)
    knobs = spec.simulator.model_dump(mode="json")
    defaults = Simulator().model_dump(mode="json")
    for name in shipped():
        known = load(name)
        try:
            same_hw = Hardware.model_validate(known.hardware) == spec.hardware
        except ValidationError:
            continue
        # The same knobs: the profile's, and the defaults everywhere else.
        wanted = {k: known.simulator.get(k, defaults[k]) for k in _MODEL_KNOBS}
        if same_hw and all(knobs[k] == v for k, v in wanted.items()):
            return Profile(
                SPEC_PROFILE,
                f"the spec's hardware = profile {known.name}: {known.source}",
                step_error if step_error is not None else known.step_error,
                known.worst_step_error,
                known.measured,
                known.assumed,
                hardware,
                {},
            )
    error = UNMEASURED_STEP_ERROR if step_error is None else step_error
    assumed = (
        f"step-time error of the spec's hardware: never compared with a GPU, {error:.0%} assumed"
        if step_error is None
        else f"step-time error {error:.0%} (--step-error)",
        "all-reduce latency and bandwidth: not measured",
    )
    return Profile(SPEC_PROFILE, "the spec's hardware block", error, error, False, assumed, hardware, {})
