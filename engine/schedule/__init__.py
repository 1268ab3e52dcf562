"""The continuous batch: a row's state, the scheduler's round (schedule -> run ->
postprocess), arbitration between proposers, verification with its typed per-row outcome,
the width policy and the forecast of a row's remaining tokens.

Imports every room below it; the prefix cache reaches it through `RowHooks`."""
