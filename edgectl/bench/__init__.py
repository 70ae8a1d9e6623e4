"""edgectl bench (not yet built)."""
