"""Pricing: the engine's cost curve (costs.py: the CostTable measured or assumed, the CostModel
that learns a drift), which span is worth a verify pass and how long (span_policy.py), and the
drafting plan: whether, when and how long draft children write (drafting.py)."""
