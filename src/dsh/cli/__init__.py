"""The `dsh` command line: thin adapters that parse, call the library and render."""
