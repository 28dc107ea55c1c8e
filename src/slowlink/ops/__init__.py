"""Operating a run: what a run in a mailbox is doing (status), one HTML page about it (report), and
metrics for dashboards. Everything here reads the store or a session; nothing here writes to the store.
"""
