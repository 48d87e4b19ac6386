"""The `gebackend` command line."""
