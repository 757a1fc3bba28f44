"""Benchmarks: suites of real prompts, modes run side by side, ratios to `ar`."""
