"""Measurements that need no Lightning: system metrics, device peak FLOP/s, reading memory snapshots."""
