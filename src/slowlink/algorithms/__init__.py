"""Pure math of the methods: arrays in, arrays out, no I/O, no clocks, no threads.

Arrays are numpy float32, keyed by parameter name. Real runs and tests call these same functions.
"""
