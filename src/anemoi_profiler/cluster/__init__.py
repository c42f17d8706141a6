"""The job's view across ranks and nodes, built from the rank exchange while the run goes on.

`system_nodes` brings each node's system samples to rank 0 (`system_metrics/`, the `system/cluster/...` view);
`window_exchange` gathers every rank's window summaries into one table per window; `flagged_traces` keeps the
traces of the ranks those tables flag.
"""
