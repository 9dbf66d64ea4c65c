"""DSpark speculative decoding (spec §7–§8): drafter rings, drafting, scheduling, lossless verification, metrics."""
