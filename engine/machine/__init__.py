"""The machine: where jumpahead keeps its files, the BLAS bound before mlx loads, threads.

The lowest room of engine/: it imports no other room."""
