"""The embedded vLLM fleet simulator: OpenAI-compatible servers whose timing follows a roofline
performance model and whose /metrics match real vLLM (see docs/simulator.md)."""
