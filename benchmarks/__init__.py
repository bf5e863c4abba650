"""GPU benchmarks: `nox -s bench` (or `python -m benchmarks.run`). Not shipped in the wheel."""
