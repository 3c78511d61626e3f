"""Finished investigations: each module's docstring states its question and the answer found.

Run one with ``python -m bench investigations.NAME [args...]``; ``docs/history.md`` lists them.
"""
