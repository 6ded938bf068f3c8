"""The ``compactmq`` command line: thin, each command parses, calls a service, renders."""
