"""Training the engine's own model: corpus preparation, reduced vocabulary, balancing, the loop."""
