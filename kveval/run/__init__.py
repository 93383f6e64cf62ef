"""The parent process: plan the cells, run each in its own child process, keep every result."""
