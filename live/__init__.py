"""A live agent testbed: a world of small coding tasks with independent checks
(world.py), a sandboxed workspace and tools (sandbox.py), synthetic trajectories
that teach the default model to use the tools (trajectories.py), and the live A/B
runs of agents against real servers (arms.py, runner.py, summary.py). The adapter
trained on those trajectories is trained by training/train.py (`jumpahead
train-adapter`) and shipped in engine/weights/adapters/smol-agent (`jumpahead serve
--adapter smol-agent`); the write-up of a run is research/writeup.py."""
