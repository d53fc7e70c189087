"""GPU facilities shared by the pipeline, the side tasks and the dashboard.

``nvml`` (device facts and a sampler of SM clock, power and memory) and ``mps`` (starting and
stopping a private CUDA MPS control daemon).
"""
