"""Prometheus metrics: what each process observes and what the store holds."""
