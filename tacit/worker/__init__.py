"""Execution: everything one rank does with a step. rank.py builds a rank (its cores, its shard,
its runner) and runs a worker's loop; model_runner.py applies the step's request changes, builds
the input batch (input_batch.py), runs the execution paths that accept its rows (paths/) and
samples; kv_allocation.py sizes the KV pool once; swap_store.py carries out swap copies."""
