"""What runs a side task: the user API (``api``), the per-stage ``worker`` and its ``client``,
the task ``host`` process and its ``spec``, ``edges`` (bubble edges from the rank, in shared
memory), ``limits`` (MPS / memory caps), and the heartbeat and watchdog that catch hung steps.
"""
