"""asrfit's benchmarks: ``python -m bench NAME [args...]`` runs ``bench/NAME.py``'s ``main()``.

Run from the repository root with the package's source importable (``PYTHONPATH=src``). The
modules whose names start with ``_`` are shared by the benchmarks and run nothing;
``bench/cases.py`` holds every held-out case set with the date it was written;
``bench/investigations/`` holds finished investigations, each with its question and answer in
its docstring (and in ``docs/history.md``). ``python -m bench --list`` lists what runs;
``python -m bench headline`` runs what ``make bench`` runs.
"""
