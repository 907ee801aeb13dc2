"""The example fleet specs: the one home of every example. The compose stack mounts this folder at
/specs, and the wheel installs it as the package data `crossover.examples` (pyproject.toml), so a
new *.yaml here is shipped, listed by `crossover init --list` and covered by the tests."""
