"""Eval harness: tasks, metrics, backends, reports, benchmarks."""
