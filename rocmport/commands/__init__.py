"""Commands: one module per subcommand; each parses its options, calls the engine and prints. Nothing
outside this package (and cli.py) imports it."""
