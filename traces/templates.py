"""Chat-template variants for replay (`jumpahead replay --show-reasoning`).

The embedded SmolLM2 template, like many, drops an earlier assistant message's
reasoning from the prompt, so compacting or clearing reasoning changes no prompt token
under it. Reasoning models' in-loop templates (DeepSeek's, Qwen3's) keep it as
`<think>...</think>`; this variant renders the embedded template that way, so replay
can measure what reasoning compaction removes where a template shows it. Only the
served tokenizer's template changes: same weights, vocabulary and output format.
"""

from __future__ import annotations

from typing import Any

# The embedded template's assistant line (engine/model/default_model.py CHAT_TEMPLATE) and
# its variant that writes the message's reasoning before its content.
PLAIN = "{{- '<|im_start|>assistant\\n' + content -}}"
SHOWN = ("{{- '<|im_start|>assistant\\n' -}}{%- if message.reasoning_content -%}"
         "{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' -}}{%- endif -%}{{- content -}}")


class TemplateError(ValueError):
    """The tokenizer's template has no known reasoning variant."""


def showing_reasoning(tokenizer: Any) -> Any:
    """A copy of the (mlx-lm) tokenizer whose chat template shows earlier assistant
    reasoning; the given tokenizer is left as it is (other arms, other tests share it)."""
    hf = getattr(tokenizer, "_tokenizer", tokenizer)
    template = getattr(hf, "chat_template", None)
    if not isinstance(template, str) or template.count(PLAIN) != 1:
        raise TemplateError("--show-reasoning knows the embedded default model's chat template only "
                            "(this model's template has no known reasoning variant)")
    inner = object.__new__(type(hf))  # shallow copies: the vocabulary and Rust tokenizer are shared
    inner.__dict__.update(hf.__dict__)
    inner.chat_template = template.replace(PLAIN, SHOWN)
    if inner is hf or hf is tokenizer:
        return inner
    outer = object.__new__(type(tokenizer))
    outer.__dict__.update(tokenizer.__dict__)
    outer._tokenizer = inner
    return outer
