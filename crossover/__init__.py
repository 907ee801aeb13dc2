"""vllm-crossover: find where one vLLM topology overtakes another on goodput."""

__version__ = "0.1.0"
