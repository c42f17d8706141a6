"""The profiler's own traffic between ranks, and what it needs to know about them.

`exchange` gathers a few numbers per log interval up a tree of gloo groups and back down (`RankExchange`);
`gradient_sync` times each rank's wait for the gradient all-reduce; `parallelism` counts data-parallel replicas;
`profiled_ranks` chooses which ranks trace.
"""
