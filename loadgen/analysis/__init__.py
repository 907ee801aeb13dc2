"""Analysis: what a run's records mean (summaries, crossings, adaptive decisions, the crossover report,
result files and vLLM bench files). Nothing here sends traffic."""
