"""Predictions from a few simulations: the peak of any batch shape from a fitted cost model
(``costmodel``), and a step at full depth from traces of models built with fewer layers
(``depth``, ``reduced``).
"""
