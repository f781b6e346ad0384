"""GPT-NeoX on megatron-core tensor-parallel layers, pipelined by DeepSpeed."""
