"""Capture: the edges where agent traffic enters trajstream (gateway, openai wrapper, ...).

Modules here may import the package's models, codec, settings, topics, errors and the pure
selection code; nothing in the pipeline's core imports them.
"""
