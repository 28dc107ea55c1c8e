"""The engine: a node's driver (node.py), generic over the method (algorithms/method.py) and the channel
its messages travel by (channel.py), reading time from one clock (clock.py)."""
