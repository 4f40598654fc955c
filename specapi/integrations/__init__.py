"""Adapters that put specapi inside other tools (each imports its tool only when it is imported itself):

- `specapi.integrations.litellm`: a LiteLLM custom provider (`litellm[proxy]`'s `config.yaml`).
"""
