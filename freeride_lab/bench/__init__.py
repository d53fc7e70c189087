"""The GPU benchmark: the ``driver`` (blocks of modes side by side on emulated peers), its
``stats`` (intervals over blocks), the ``results`` and ``tables`` made from them, and the
Markdown that BENCHMARKS.md quotes.
"""
