"""LoRA adapters by name: `smol-agent` is the one shipped in this package
(`engine/weights/adapters/smol-agent`, trained by `jumpahead train-adapter`); anything
else is a path to an mlx-lm adapter folder. The loader fuses the folder this returns
(loader.py `fuse_adapter`)."""

from __future__ import annotations

from pathlib import Path

SHIPPED_DIR = Path(__file__).resolve().parents[1] / "weights" / "adapters"
SHIPPED: tuple[str, ...] = ("smol-agent",)


def resolve_adapter(spec: str) -> Path:
    """The adapter folder `spec` names (a shipped name or a path); FileNotFoundError
    when it holds no adapter_config.json and adapters.safetensors."""
    folder = SHIPPED_DIR / spec if spec in SHIPPED else Path(spec).expanduser()
    missing = [f for f in ("adapter_config.json", "adapters.safetensors") if not (folder / f).is_file()]
    if missing:
        hint = f" (shipped names: {', '.join(SHIPPED)})" if spec not in SHIPPED else \
            " (the shipped adapter is missing from this install: run `jumpahead train-adapter --out DIR`)"
        raise FileNotFoundError(f"adapter {spec!r}: {folder} lacks {', '.join(missing)}{hint}")
    return folder.resolve()
