"""Child processes: one vLLM engine per cell, and the transformers K/V range pass."""
