"""Simulate one training step on fake tensors and predict peak memory by category."""
