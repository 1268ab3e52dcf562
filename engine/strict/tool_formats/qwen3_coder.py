"""Qwen3-Coder: XML parameters with raw values,

    <tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>

strings as they are, mappings and sequences as JSON, other scalars as the template's
`|string` writes them. Parser: mlx-lm's `qwen3_coder` (values typed by the tool's
schema). Grammar: xgrammar's `qwen_3_coder` tag.
"""

from __future__ import annotations

import json
from typing import Any

from .base import ToolFamily
from .xml import XmlFormat


def value_text(value: Any) -> str:
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


FORMAT = XmlFormat(
    "qwen3_coder", start="<tool_call>", end="</tool_call>", name_open="\n<function=", name_close=">\n",
    key_open="<parameter=", key_close=">\n", value_open="", value_close="\n</parameter>\n",
    call_close="</function>\n", value_text=value_text, between="\n",
    name_re=r"<function=([^>\n]+)>", key_re=r"<parameter=([^>\n]+)>")

FAMILY = ToolFamily("qwen3_coder", "<tool_call>", "</tool_call>", "qwen_3_coder", "\n", parser="qwen3_coder",
                    format=FORMAT)
FORMAT.parse = FAMILY.parse
