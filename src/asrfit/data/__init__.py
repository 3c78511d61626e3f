"""Data: manifests, audio loading, the demo corpus and (later) the memory-budget sampler."""
