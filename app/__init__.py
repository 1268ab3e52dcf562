"""The composition root: the `jumpahead` command line and the startup code that
assembles an engine, the policies, the trace recorder and the server. Nothing below
this package imports it (docs/design.md, Layers)."""
