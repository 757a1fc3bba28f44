"""Proposing: candidate spans for the loop to verify (suffix trees, n-gram lookup, earlier
responses) and the Source value that names what proposed each."""
