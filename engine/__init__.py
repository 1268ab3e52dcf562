"""jumpahead.engine: run the model (load, batch rows, apply proposals, sample)."""

from .machine.blas import load_optimized_blas as _load_optimized_blas

_load_optimized_blas()  # must run before anything imports mlx.core
