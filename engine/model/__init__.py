"""Model acquisition: the default model, GGUF conversion, loading any mlx-lm model type,
a LoRA adapter fused at load (shipped ones found by name: lora.py), and the weights'
fingerprint. The shipped weights themselves are data in engine/weights/.

Imports only engine/machine and the base modules (types)."""
