"""v41viz: turns ModelArgs and traces into graphs, figures, tables and export files (no engine state)."""
