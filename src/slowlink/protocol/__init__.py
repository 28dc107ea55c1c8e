"""A run over a mailbox: keys, records, run creation and joining, leadership, rounds and commits."""
