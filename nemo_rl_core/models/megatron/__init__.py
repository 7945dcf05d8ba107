"""Megatron-core training backend: config, CPU compatibility, HF<->Megatron weights, workers."""
