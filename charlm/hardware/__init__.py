"""What a run executes on: the device, the autocast precision and whether to compile (device), and the processes of
a multi-process run under torchrun (distributed).

May import charlm.config and the base modules; knows nothing of data, models or runs.
"""
