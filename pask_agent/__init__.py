"""pask-agent: tool-calling and text-to-SQL agents on a small local model, PASK KV persistence."""

__version__ = "0.1.0"
