"""Integrations: slowlink inside the training loops of other libraries, one module per library.

Each module imports its library when it is imported itself, so `import slowlink` never does:
`slowlink.integrations.transformers` holds the callback for the Hugging Face `Trainer`.
"""
