"""Workflows that use both stages: evaluation (`kd eval`), the demo (`kd demo`), search and queries."""
