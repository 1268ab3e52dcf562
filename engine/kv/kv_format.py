"""How attention layers store their keys and values: full precision or quantized.

A quantized layer keeps, per token and head, MLX's affine quantization of the key and
value vectors along the head dimension (`mx.quantize`: packed uint32 words plus a
scale and a bias per `group_size` elements), the format mlx-lm's QuantizedKVCache
uses, so attention reads it with `mx.quantized_matmul` (engine/kv/attention.py). Keys and
values may take different bits (K8/V4: keys steer the softmax, values only average).

A token's quantized form depends only on its own vector, never on its neighbours, the
batch or the round it was written in, so a batched row still equals the same request
alone, a rollback is still a pointer move, and a stored prefix is exact for every
later request served with the same format. Only attention layers (full and sliding
window) are quantized; recurrent state stays as the model keeps it.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

BITS = (2, 3, 4, 5, 6, 8)  # what mx.quantize packs


@dataclass(frozen=True)
class KVFormat:
    key_bits: int
    value_bits: int
    group_size: int = 64

    def __post_init__(self) -> None:
        for name, bits in (("key", self.key_bits), ("value", self.value_bits)):
            if bits not in BITS:
                raise ValueError(f"--kv-bits: {name} bits must be one of {', '.join(map(str, BITS))}, not {bits}")
        if self.group_size not in (32, 64, 128):
            raise ValueError(f"--kv-group-size must be 32, 64 or 128, not {self.group_size}")

    @property
    def name(self) -> str:
        """e.g. "k8v8-g64": part of the prompt cache's identity (engine/engine.py)."""
        return f"k{self.key_bits}v{self.value_bits}-g{self.group_size}"

    def quantize(self, x: mx.array, bits: int) -> tuple[mx.array, mx.array, mx.array]:
        """(packed words, scales, biases) of x's last axis."""
        if x.shape[-1] % self.group_size:
            raise ValueError(f"a head dimension of {x.shape[-1]} is not a multiple of --kv-group-size {self.group_size}")
        return tuple(mx.quantize(x, group_size=self.group_size, bits=bits))  # type: ignore[return-value]

    def describe(self) -> dict[str, int | str]:
        return {"format": self.name, "key_bits": self.key_bits, "value_bits": self.value_bits,
                "group_size": self.group_size}


def parse_kv_format(bits: int | None, value_bits: int | None = None, group_size: int = 64) -> KVFormat | None:
    """The format the CLI flags ask for (None: full precision)."""
    if bits is None and value_bits is None:
        return None
    if bits is None:
        raise ValueError("--kv-value-bits needs --kv-bits (the key bits)")
    return KVFormat(int(bits), int(value_bits if value_bits is not None else bits), int(group_size))

