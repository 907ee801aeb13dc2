"""The /metrics contract check, shared with the real-vLLM test (it lives in crossover.contract so
that the lead's real-server test and the simulator's test run the very same assertions)."""

from crossover.contract import check_metrics_contract

__all__ = ["check_metrics_contract"]
