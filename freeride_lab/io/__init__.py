"""The run's files and wires, shared by the training ranks and the side-task workers.

``rundir`` (a run directory's layout, the one source of truth), ``sink`` (a process's
non-blocking event writer), ``bus`` (the live, authenticated event stream to the session) and
``handshake`` (the HMAC handshake of the run's control channels).
"""
