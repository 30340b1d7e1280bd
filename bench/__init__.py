"""Overhead benchmarks: ``python -m bench`` (``make bench``) prints one table of ratios.

Every ratio is measured side by side in one process, one thread, as the median of many warm
runs interleaved round-robin with the baseline it is divided by, so drift in machine load hits
both. Nothing here is a test: the tests never assert wall-clock times.
"""
