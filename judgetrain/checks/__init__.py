"""The checks that run a piece of every stage before a launch: the dry run, the preflight and the memory estimate."""
