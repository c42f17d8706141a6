"""The fault-injection suite (docs/reliability.md)."""
