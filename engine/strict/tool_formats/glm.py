"""GLM 4.5-4.7: `<tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>...</tool_call>`,
strings raw, other values as JSON. Parser: mlx-lm's `glm47`. Grammar: xgrammar's
`glm_4_7` tag.
"""

from __future__ import annotations

import json
from typing import Any

from .base import ToolFamily
from .xml import XmlFormat


def value_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


FORMAT = XmlFormat(
    "glm", start="<tool_call>", end="</tool_call>", name_open="", name_close="",
    key_open="<arg_key>", key_close="</arg_key>", value_open="<arg_value>", value_close="</arg_value>",
    call_close="", value_text=value_text,
    name_re=r"^\s*([^<\s]+)\s*(?=<)", key_re=r"<arg_key>([^<]*)</arg_key>")

FAMILY = ToolFamily("glm", "<tool_call>", "</tool_call>", "glm_4_7", "", parser="glm47", format=FORMAT)
FORMAT.parse = FAMILY.parse
