"""Small helpers split by concern: ``io`` (atomic writes), ``serialization`` (JSON dataclasses)."""
