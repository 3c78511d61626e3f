"""Step adapters: how the simulator builds each supported model, makes its batch on fake
tensors and computes its loss (``adapters`` per family, ``generic`` for any transformers
CTC or speech-to-text model).
"""
