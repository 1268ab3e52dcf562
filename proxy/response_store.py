"""A bounded in-memory store of Responses API answers, for `previous_response_id`.

Each entry keeps the conversation as the model saw it (without the request's
`instructions`, which do not carry over) plus the answer, and the response object
for `GET /v1/responses/{id}`. The least recently used entries go first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from jumpahead.core.turn import Message


@dataclass
class StoredResponse:
    messages: list[Message]  # the conversation including this response's output
    response: dict[str, Any] = field(default_factory=dict)


class ResponseStore:
    def __init__(self, max_entries: int = 512) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, response_id: str, entry: StoredResponse) -> None:
        with self._lock:
            self._entries[response_id] = entry
            self._entries.move_to_end(response_id)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            entry = self._entries.get(response_id)
            if entry is not None:
                self._entries.move_to_end(response_id)
            return entry

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._entries.pop(response_id, None) is not None

    def __len__(self) -> int:
        return len(self._entries)
