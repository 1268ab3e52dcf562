"""Text out of message content: a string, one content block, or a list of blocks.

Every protocol and every agent's session file holds content this way; what differs is
how a block gives its text (Anthropic documents and search results, OpenAI image
parts, an importer that skips what it does not know) and whether a bad block is the
client's error. So one walker reads the shape, and each reader passes its own
`read_block`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# (block, where) -> the block's text, or None where it has none. `block` is any item
# of the list but a string (strings are text as they are); `where` names it for an
# error message ("messages[2].content[1]").
BlockReader = Callable[[Any, str], "str | None"]


def content_texts(content: Any, read_block: BlockReader, param: str = "content") -> list[str] | None:
    """The texts of `content` in order: [] for None, [content] for a string, a block's
    or each listed block's text (strings among them as they are); None where
    `content` is none of these shapes (the caller's error or fallback)."""
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    if isinstance(content, dict):
        content = [content]
    if not isinstance(content, list):
        return None
    texts = []
    for i, block in enumerate(content):
        text = block if isinstance(block, str) else read_block(block, f"{param}[{i}]")
        if text is not None:
            texts.append(text)
    return texts
