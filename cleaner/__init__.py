"""Retention and garbage collection of checkpoint files: a pure planner and an executor.
Imports only `metadata` (DESIGN §3)."""

__all__: list[str] = []
