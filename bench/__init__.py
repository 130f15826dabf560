"""cgwatch benchmarks: `python -m bench` (see bench/README.md).

Measures, in one process and one run, what cgwatch's queries cost next to
psutil.virtual_memory() and an uncached cgroup walk, how fast a limit change is seen, and what
the background thread costs while nothing happens.
"""
