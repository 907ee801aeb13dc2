"""Developer support for the tests, scripts/capture-vllm-fixtures and the benchmarks: real vLLM CPU
servers on loopback (`devkit.realvllm`) and the /metrics contract they and the simulator are held to
(`devkit.contract`).

Not part of the wheel (pyproject.toml's packages leave it out): nothing shipped imports it. Imported
from the repository root, which pytest puts on sys.path; scripts and benchmarks append it themselves.
"""
