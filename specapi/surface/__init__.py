"""The SDK-shaped clients: `AsyncSpeculativeOpenAI`, `SpeculativeOpenAI` and their resources."""
