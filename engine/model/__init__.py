"""Model acquisition: the default model, GGUF conversion, loading any mlx-lm model type,
a LoRA adapter fused at load, and the weights' fingerprint.

Imports only engine/machine and the base modules (types)."""
