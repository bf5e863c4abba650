"""The polykernels factory: builds, checks, gates and publishes the payload. Never shipped.

It imports neither torch nor polykernels: it reaches the payload only through the kernel
registry (run in subprocesses) and through built wheels.
"""
