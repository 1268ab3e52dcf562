"""A live agent testbed: a world of small coding tasks with independent checks
(world.py), a sandboxed workspace and tools (sandbox.py), synthetic trajectories
that teach the default model to use the tools (trajectories.py), LoRA training of a
small adapter (train.py, `jumpahead train-adapter`), and the shipped adapter
(`adapters/smol-agent`, `jumpahead serve --adapter smol-agent`)."""
