"""Runners of the core: the live Faust worker (``live``) and replay (``replay``).

May import everything in the product: the core, the edges in ``streams.io``, faust. Not
``streams.devtools``.
"""
