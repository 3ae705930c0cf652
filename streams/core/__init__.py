"""The pure pipeline core: selection, assembly, rewards, the reward join, ledger, commits.

May import: the standard library, pydantic, fastavro and the top-level ``streams.models``,
``streams.codec``, ``streams.errors``, ``streams.topics``. Never faust, aiokafka, aiohttp or
httpx, and nothing from ``streams.runtime``, ``streams.io``, ``streams.capture`` or
``streams.devtools`` (``tests/unit/core/test_purity.py`` checks it).
"""
