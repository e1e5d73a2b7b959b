"""The names of every private torch API wandb_modprof touches, each with what it is for (and,
for an optional one, what is lost without it): the registry that `torch_private` looks up and
checks, and `tests/capture/test_torch_private.py` tests on every supported torch.
"""

from __future__ import annotations

_CALIBRATION = "the hook-cost calibration runs unobserved"
_MODES = "the structure pass's torch modes"
REQUIRED: dict[str, str] = {  # watch / profile: `check()` raises without one
    "torch._C._autograd._get_sequence_nr": "the autograd nodes a module call created",
    "torch._C._current_graph_task_id": "whether a backward runs (checkpoint recomputes)",
    "torch._C._autograd._top_saved_tensors_default_hooks": "whose saved-tensor hooks are on",
    "torch.autograd.Variable._execution_engine": "work at the end of a backward",
    "torch.utils._python_dispatch.TorchDispatchMode": _MODES,
    "torch.utils._python_dispatch._get_current_dispatch_mode_stack": _MODES,
    "torch.overrides._get_current_function_mode_stack": _MODES,
    "torch.utils._python_dispatch.is_traceable_wrapper_subclass": "tensor subclass storages",
    "torch.utils._pytree.tree_leaves": "the tensors of an op's arguments",
    "torch.utils._pytree.tree_map_only": "the fake inputs of a compiled model's pass",
    "torch._ops.HigherOrderOperator": "ops whose work is inside them (torch.cond & co.)",
    "torch._foreach_norm": "gradient and weight norms in fused calls",
    "torch.nn.Module._call_impl": "which module calls are open on the stack",
    "torch._C._len_torch_dispatch_stack": _CALIBRATION,
    "torch._C._is_torch_function_mode_enabled": _CALIBRATION,
    "torch.autograd.profiler._is_profiler_enabled": _CALIBRATION,
}
ON_MODULE: dict[str, str] = {  # `on_module` besides: `check(on_module=True)` raises
    "torch._C._current_autograd_node": "the node whose hook runs",
    "torch._C._will_engine_execute_node": "whether the backward runs a node",
}
_HOOKS = "our hooks put back at every sample"
INLINE: dict[str, str] = {  # read inline on torch objects: `check()` probes each
    "torch.Tensor._version": "saved activations modified in place; buffers written",
    "torch.Tensor._base": "the base of a view, followed by the structure pass",
    "torch.Tensor._values": "the bytes and norms of sparse COO tensors",
    "torch.Tensor._indices": "the bytes of sparse COO tensors",
    "torch.autograd.graph.Node._sequence_nr": "which call created an autograd node",
    "torch._ops.OpOverload._overloadpacket": "the FLOP formula of an op",
    "torch.nn.Module._parameters": "parameters without a walk of named_parameters()",
    "torch.nn.Module._buffers": "buffers without a walk of named_buffers()",
    "torch.nn.Module._compiled_call_impl": "modules compiled in place (module.compile())",
    "torch.nn.Module._forward_pre_hooks": _HOOKS,
    "torch.nn.Module._forward_pre_hooks_with_kwargs": _HOOKS,
    "torch.nn.Module._forward_hooks": _HOOKS,
    "torch.nn.Module._forward_hooks_with_kwargs": _HOOKS,
    "torch.nn.Module._forward_hooks_always_called": _HOOKS,
}
GLOBAL_HOOKS = "the hook-cost calibration does not see global module hooks"
_NO_BWD_FLOPS = "no backward FLOPs counted for this op"
_LOSS_SCALE = "gradient norms of an AMP run keep the loss scale"
OPTIONAL: dict[str, str] = {  # features degrade without them: `check()` warns once per one
    "torch._C._functorch.peek_interpreter_stack": "forwards under torch.func are sampled",
    "torch._C._push_on_torch_dispatch_stack": "the structure pass counts no backward ops",
    "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu": "no FLOPs of CPU attention",
    "torch.ops.aten._convolution": _NO_BWD_FLOPS,
    "torch.ops.aten._scaled_dot_product_flash_attention": _NO_BWD_FLOPS,
    "torch.ops.aten._scaled_dot_product_efficient_attention": _NO_BWD_FLOPS,
    "torch.ops.aten._scaled_dot_product_cudnn_attention": _NO_BWD_FLOPS,
    "torch.amp.GradScaler._get_scale_async": _LOSS_SCALE,
    "torch.amp.GradScaler._maybe_opt_step": _LOSS_SCALE,
    "torch.optim.optimizer._global_optimizer_pre_hooks": "dead watches' step hooks stay",
    "torch.nn.modules.module._global_forward_pre_hooks": GLOBAL_HOOKS,
    "torch.nn.modules.module._global_forward_hooks": GLOBAL_HOOKS,
    "torch.nn.modules.module._global_backward_pre_hooks": GLOBAL_HOOKS,
    "torch.nn.modules.module._global_backward_hooks": GLOBAL_HOOKS,
    "torch.nn.modules.module._global_module_registration_hooks": GLOBAL_HOOKS,
    "torch.nn.modules.module._global_parameter_registration_hooks": GLOBAL_HOOKS,
    "torch.nn.modules.module._global_buffer_registration_hooks": GLOBAL_HOOKS,
}
_FSDP2 = "the sharded parameters of FSDP2 (fully_shard) modules"
FAKE = "the structure of a compiled model"
UNTRACED = "our hooks run untraced under torch.compile"
LAZY: dict[str, str] = {  # looked up where used: Dynamo costs a second; torch.distributed
    "torch._C._dynamo.eval_frame.get_eval_frame_callback": UNTRACED,
    "torch._dynamo.eval_frame.skip_code": UNTRACED,
    "torch._dynamo.disable": UNTRACED,
    "torch._dynamo.eval_frame.OptimizedModule": "apply_checkpoint_plan refuses compiled modules",
    "torch._dynamo.eval_frame.OptimizedModule._orig_mod": "the user's module in a compiled one",
    "torch._subclasses.fake_tensor.FakeTensor": FAKE,
    "torch._subclasses.fake_tensor.FakeTensorMode": FAKE,
    "torch.nn.utils.stateless._reparametrize_module": FAKE,
    "torch.distributed.distributed_c10d._get_default_store": "per-rank statistics to rank 0",
    "torch.distributed.fsdp.FullyShardedDataParallel._fsdp_wrapped_module": "FSDP1 models",
    "torch.distributed.fsdp.FSDPModule._get_fsdp_state": _FSDP2,
    "torch.distributed.fsdp._fully_shard._fsdp_state.FSDPState._fsdp_param_group": _FSDP2,
    "torch.distributed.fsdp._fully_shard._fsdp_param.FSDPParam._module_info": _FSDP2,
    "torch.distributed.tensor.DTensor._local_tensor": "a DTensor's shard (no collective)",
}
