"""Verifying: pure functions of arrays that decide which proposed tokens the model itself would
have written (greedy, exact rejection sampling, token trees), and the lossless checks."""
