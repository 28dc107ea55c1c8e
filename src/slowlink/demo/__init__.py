"""The `slowlink demo`: a small GPT trained on the Python standard library by several processes joined
only by a directory mailbox, compared with one process alone (corpus, model, run, report).
"""
