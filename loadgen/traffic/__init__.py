"""Traffic: what the sweep sends and how it times each token (client, transport, SSE, datasets, tokens,
worker processes). Nothing here reads the analysis."""
