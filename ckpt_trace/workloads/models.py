"""GPT-2-shaped state dicts with random weights (no downloads).

Shapes follow the GPT-2 family as published by OpenAI and used by Hugging
Face ``GPT2LMHeadModel`` (Radford et al., 2019): tied token embedding
``wte`` [vocab, d], position embedding ``wpe`` [ctx, d], per block LayerNorms,
``c_attn`` [d, 3d], ``c_proj`` [d, d], MLP ``c_fc`` [d, 4d] and ``c_proj`` [4d, d].
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPT2Config:
    n_layer: int
    d_model: int
    vocab: int = 50257
    n_ctx: int = 1024


MODELS = {
    "gpt2-tiny": GPT2Config(n_layer=2, d_model=128, vocab=1024, n_ctx=128),
    # Deep and narrow: many small tensors (256 B to 64 KiB), for small-operation-heavy checkpoints.
    "gpt2-deep-tiny": GPT2Config(n_layer=1024, d_model=64, vocab=1024, n_ctx=128),
    "gpt2-small": GPT2Config(n_layer=12, d_model=768),
    "gpt2-medium": GPT2Config(n_layer=24, d_model=1024),
    "gpt2-large": GPT2Config(n_layer=36, d_model=1280),
    "gpt2-xl": GPT2Config(n_layer=48, d_model=1600),
}


def parameter_shapes(cfg: GPT2Config) -> dict[str, tuple[int, ...]]:
    """Fully qualified parameter names -> shapes, in module order."""
    d = cfg.d_model
    shapes: dict[str, tuple[int, ...]] = {"wte.weight": (cfg.vocab, d), "wpe.weight": (cfg.n_ctx, d)}
    for i in range(cfg.n_layer):
        block = f"h.{i}."
        shapes.update(
            {
                block + "ln_1.weight": (d,),
                block + "ln_1.bias": (d,),
                block + "attn.c_attn.weight": (d, 3 * d),
                block + "attn.c_attn.bias": (3 * d,),
                block + "attn.c_proj.weight": (d, d),
                block + "attn.c_proj.bias": (d,),
                block + "ln_2.weight": (d,),
                block + "ln_2.bias": (d,),
                block + "mlp.c_fc.weight": (d, 4 * d),
                block + "mlp.c_fc.bias": (4 * d,),
                block + "mlp.c_proj.weight": (4 * d, d),
                block + "mlp.c_proj.bias": (d,),
            }
        )
    shapes.update({"ln_f.weight": (d,), "ln_f.bias": (d,)})
    return shapes


def parameter_count(cfg: GPT2Config) -> int:
    total = 0
    for shape in parameter_shapes(cfg).values():
        n = 1
        for dim in shape:
            n *= dim
        total += n
    return total
