"""A topology's entrypoint: the P/D proxy (vLLM's NixlConnector flow) or a round-robin balancer.

One component, three users: the simulator serves it in front of its simulated instances, the demo
starts it (`crossover pdproxy`) in front of a real fleet, and the compose `gpu-pd` profile runs it
in front of real GPUs.
"""
