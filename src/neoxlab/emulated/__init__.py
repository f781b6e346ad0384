"""An emulated multi-node cluster on one machine: network namespaces, bridges and tc."""
