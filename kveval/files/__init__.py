"""The run directory and its typed files: the one place that reads and writes them."""
