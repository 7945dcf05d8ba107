"""Bin packing of variable-length sequences into fixed token budgets (sequence packing)."""
