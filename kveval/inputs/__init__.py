"""What a run is made of: models, KV specs, prompts, suites, long-context task data."""
