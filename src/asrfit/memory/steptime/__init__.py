"""Step time from a trace: FLOPs and bytes of every aten op (``runtime``), and their seconds
on a device's rates (``roofline``, which imports no torch). See docs/step_time.md.
"""
