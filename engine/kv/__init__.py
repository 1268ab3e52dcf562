"""The batched forward: the per-row KV cache (plain and quantized), attention over ragged
rows, the fast ops verified at load, the model runner and the load-time serving checks.

Imports engine/machine, engine/model and the base modules."""
