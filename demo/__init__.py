"""`crossover demo`: the whole stack on one machine, each part started through its own subcommand."""
