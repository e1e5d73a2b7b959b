"""Capture: hooks on a live model during sampled steps, turned into invocation records.

Takes an `nn.Module` and `Options`; gives, through a `SampleSink` (`sink`), each finished step
session (`session.StepSession`) as a plain, frozen record (`session_record.SessionRecord`)
with `resolve.resolve` to turn it into a `records.Sample` off the hot path, and
`records.Structure`s. Imports `records` and the base modules only.

One sub-package per thing captured, lowest first; each imports only those before it:

* `step/`: what every timed window shares (clock, hook cost, garbage collector, private
  autograd entry points, stack room, which models are hooked);
* `model/`: what the model is under its wrappers (DDP, FSDP, `torch.compile`);
* `forward/`: module calls and their keys, `on_module`'s engine;
* `memory/`: saved-tensor bytes, allocator counters, static memory per module;
* `structure/`: the module graph (structure pass, FLOPs, the graph a timed step derives);
* `backward/`: autograd node stamps, checkpoint recomputes, NVTX ranges.

At the top, the sampled step put together and handed over, above every sub-package:
`hooks.Capture` (its step boundaries at the root: `root_hooks`; the hooks feeding a sampled
step's session: `session_hooks`; which submodules carry hooks: `submodule_hooks`), `session`,
`session_record`, `step_queue`, `delivery`, `resolve` with `memory_curve`, the backward
charged to its calls `backward_charges` and as runs for traces `backward_runs`, and `sink`.
Two leaves any module may import: `options` and `inert_hook` (the path pickles of watched
models name). `static_memory` here only forwards two records to the statistics stage under
their old path.
"""
