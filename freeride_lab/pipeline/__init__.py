"""What runs a training rank: ``rank`` (the torchrun entry point), the timed stage and its
step clock, ``emulate``/``synthetic`` (one real stage with emulated peers), the data, the clock
alignment, the stop agreement, and ``launcher`` (the process that owns torchrun).
"""
