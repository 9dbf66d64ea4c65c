"""DSpark speculative decoding: drafter scheduling and lossless verification (spec §7–§8)."""
