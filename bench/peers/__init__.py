"""Benchmark adapters that run Ratchet's benchmark measures on peer engines.

Each module is runnable as ``python -m bench.peers.<name> MEASURE [options]`` and prints
exactly one JSON object on the last line of stdout. Shared plumbing lives in ``common``.
"""
