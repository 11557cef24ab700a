"""Simulacra core library: configuration, trajectory schema, DuckDB store, format adapters, filters."""

__version__ = "0.1.0"
