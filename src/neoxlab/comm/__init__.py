"""Compressed collectives per parallel dimension, and the patch that routes engines to them."""
