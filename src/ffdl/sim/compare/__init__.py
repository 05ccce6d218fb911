"""Scheduling policies compared on Philly-derived workloads with memory-bounded batches."""
