"""The argument names GPT-NeoX accepts in a neox.yml (at the commit in patches/upstream.lock).

GPT-NeoX's argument classes refuse unknown keys only when the job has already started on the
cluster; checking engine.neox_args against these names catches a typo before submission.
Read from megatron/neox_arguments/neox_args.py and deepspeed_args.py (field names only).
"""

from __future__ import annotations

KNOWN_ARGS = frozenset("""
    account activation activation_checkpointing adlr_autoresume adlr_autoresume_interval
    allow_chopped amp apply_query_key_layer_scaling attention_config attention_dropout
    attention_softmax_in_fp32 autotuning autotuning_run base_shapes_file batch_size bf16
    bias_dropout_fusion bias_gelu_fusion char_level_ppl checkpoint checkpoint_activations
    checkpoint_factor checkpoint_in_cpu checkpoint_num_layers checkpoint_scale
    checkpoint_validation_with_forward_pass clip_grad comet_experiment comet_experiment_name
    comet_others comet_project comet_tags comet_workspace comment comms_logger
    communication_data_type compression_training config_files contiguous_checkpointing
    coord_check csv_monitor curriculum_learning curriculum_seqlen data_efficiency data_impl
    data_path data_types dataset_impl deepscale deepscale_config deepspeed
    deepspeed_activation_checkpointing deepspeed_extra_args deepspeed_mpi deepspeed_slurm
    dim_att distributed_backend do_test do_train do_valid dpo_beta dpo_fp32
    dpo_reference_free dump_state dynamic_loss_scale elasticity eod_mask_loss eval_interval
    eval_iters eval_results_prefix eval_tasks exclude exit_interval expansion_factor
    extra_save_iters ffn_dim finetune flops_profiler force_multi fp16 fp16_lm_cross_entropy
    fp32_allreduce fp32_reinforce fused_kernels_build_path git_hash global_num_gpus
    gmlp_attn_dim gpt_j_residual gpt_j_tied gradient_accumulation_steps gradient_clipping
    gradient_noise_scale_cpu_offload gradient_noise_scale_n_batches
    gradient_predivide_factor head_size hidden_dropout hidden_size hostfile hysteresis
    include init_method init_method_std intermediate_size is_pipe_parallel iteration
    keep_last_n_checkpoints kl_div_beta kl_impl kto_beta kto_desirable_weight kto_fp32
    kto_undesirable_weight launcher layernorm_epsilon layernorm_fusion lazy_mpu_init load
    local_rank log_dir log_grad_norm log_grad_pct_zeros log_gradient_noise_scale
    log_interval log_optimizer_states log_param_norm loss_scale loss_scale_window lr
    lr_decay_fraction lr_decay_iters lr_decay_style make_vocab_size_divisible_by
    mamba_causal_conv_fusion mamba_inner_func_fusion mamba_selective_fp32_params
    mamba_selective_scan_fusion mamba_use_bias_in_conv mamba_use_bias_in_linears master_addr
    master_port max_position_embeddings maximum_tokens memory_profiling
    memory_profiling_path merge_file min_lr min_scale mlp_multiple_of mmap_warmup
    model_parallel_size moe_expert_interval moe_jitter_eps moe_lbl_in_fp32 moe_num_experts
    moe_router_type moe_top_k mup_attn_temp mup_embedding_mult mup_init_scale
    mup_output_temp mup_rp_embedding_mult mup_width_scale neg_test_data_paths
    neg_test_label_data_paths neg_train_data_paths neg_train_label_data_paths
    neg_valid_data_paths neg_valid_label_data_paths no_load_optim no_load_rng no_save_optim
    no_save_rng no_ssh_check no_weight_tying norm num_attention_heads num_gpus num_kv_heads
    num_layers num_nodes num_samples num_unique_layers num_workers online_dataserver_ips
    online_dataserver_ports onnx_safe opt_pos_emb_offset optimizer optimizer_type
    output_layer_init_method output_layer_parallelism override_lr_scheduler pack_impl
    padded_vocab_size param_sharing_style partition_activations peak_theoretical_tflops
    pipe_parallel_size pipe_partition_method pos_emb pos_test_data_paths
    pos_test_label_data_paths pos_train_data_paths pos_train_label_data_paths
    pos_valid_data_paths pos_valid_label_data_paths precision precompute_model_name
    prescale_gradients profile profile_backward profile_step_start profile_step_stop
    prompt_end rank recompute reinforce_leave_one_out return_logits rms_norm_epsilon
    rmsnorm_fusion rope_fusion rotary_emb_base rotary_pct rotary_save_freqs_buffer
    rpe_max_distance rpe_num_buckets s3_chunk_size s3_path sample_input_file
    sample_output_file save save_base_shapes scaled_masked_softmax_fusion
    scaled_upper_triang_masked_softmax_fusion scalenorm_epsilon scheduler seed seq_length
    sequence_parallel serve_model_weights short_seq_prob sliding_window_width
    soft_prompt_tuning sparse_attention sparse_gradients sparsity_config split
    steps_per_print synchronize_each_layer te_columnparallel te_fp8_amax_compute_algo
    te_fp8_amax_history_len te_fp8_format te_fp8_margin te_fp8_mha te_fp8_wgrad
    te_layernorm_mlp te_mha te_rowparallel temperature tensorboard tensorboard_dir
    test_data_paths test_data_weights test_label_data_paths test_reward_data_paths
    text_gen_type tokenizer_type top_k top_p train_batch_size train_data_paths
    train_data_weights train_epochs train_impl train_iters train_label_data_paths
    train_micro_batch_size_per_gpu train_reward_data_paths use_bias_in_attn_linear
    use_bias_in_mlp use_bias_in_norms use_bnb_optimizer use_checkpoint_lr_scheduler
    use_comet use_cpu_initialization use_flashattn_swiglu use_mup use_qk_layernorm
    use_shared_fs use_wandb user_script valid_data_paths valid_data_weights
    valid_label_data_paths valid_reward_data_paths vocab_file wall_clock_breakdown wandb
    wandb_group wandb_host wandb_init_all_ranks wandb_project wandb_run_name wandb_team
    warmup weight_by_num_documents weight_decay weight_server_port weighted_sampler_alpha
    world_size z_loss zero_allgather_bucket_size zero_contiguous_gradients zero_optimization
    zero_reduce_bucket_size zero_reduce_scatter zero_stage
""".split())

# NeoXArgsTokenizer.tokenizer_type's choices.
TOKENIZER_TYPES = (
    "GPT2BPETokenizer", "HFTokenizer", "HFGPT2Tokenizer", "SPMTokenizer",
    "CharLevelTokenizer", "TiktokenTokenizer",
)
