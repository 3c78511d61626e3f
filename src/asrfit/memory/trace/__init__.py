"""The fake-tensor trace of one step: live storages, shadow values, data-dependent ops, the
autograd engine's accumulation, kernels that differ by device, kernel scratch, the optimizers.

Imports nothing of :mod:`asrfit.memory` but :mod:`asrfit.memory.setup`.
"""
