"""What the benchmarks, ``verify`` and ``report`` feed a tower and how they score it: layouts from specs,
random towers and pixels (``workload``), serving streams and their latency summaries (``traffic``).
Below both ``cli`` and ``report``, which share them."""
