"""Capacity planning: every layout a GPU budget admits, ranked on the simulator's ground truth."""
