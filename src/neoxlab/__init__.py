"""neoxlab: communication-compressed GPT-NeoX experiments."""
