"""What runs a training rank: ``rank`` (the torchrun entry point) with ``runner`` (setup and the
step loop) and ``stage_build`` (stages, schedule, batches), the timed stage and its step clock,
``emulate``/``synthetic`` (one real stage with emulated peers), the data, the clock alignment,
the stop agreement, and ``launcher`` (the process that owns torchrun; ``rendezvous`` builds
torchrun's command line and ``run_failure`` explains a failed run).
"""
