"""The `kveval` command line: a thin click shell over kveval.api."""
