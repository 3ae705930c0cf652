"""Dataset export (``dataset``: SFT/DPO/trajectory files and their manifest) and redaction
(``redact``).

May import the top-level modules and the core; no Kafka or HTTP client.
"""

from .dataset import *  # noqa: F403  (``from streams.export import ...`` keeps working)
from .dataset import __all__ as _dataset_all

__all__ = list(_dataset_all)
