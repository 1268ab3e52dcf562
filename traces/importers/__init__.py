"""Built-in importers: importing this package registers every format (traces/formats.py).

Minimal for now (jumpahead's own traces); the other formats' importers add themselves here.
"""

from . import jumpahead_trace  # noqa: F401
