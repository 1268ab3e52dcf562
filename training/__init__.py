"""The trainers of the shipped weights (engine/weights/README.md lists them): the LoRA
adapter that teaches the default model the task world's tools (train.py, `jumpahead
train-adapter`, from the live task world's synthetic trajectories) and the learned
drafter for a served model (train_drafter.py, `jumpahead train-drafter`; its CUDA path
train_drafter_torch.py runs alone on a GPU machine).

Imports engine, traces and live (the task world the adapter is trained on)."""
