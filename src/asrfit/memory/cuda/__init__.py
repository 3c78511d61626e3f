"""What the GPUs hold beyond a traced step: the CUDA caching allocator and the device's fixed
costs (``allocator``), and ZeRO / DDP model states across devices by formula (``zero``).
Neither imports torch.
"""
