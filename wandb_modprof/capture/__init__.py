"""Capture: hooks on a live model during sampled steps, turned into invocation records.

Takes an `nn.Module` and `Options`; gives, through a `SampleSink` (`sink`), finished step
sessions (`session.StepSession`: forward stamps, autograd node stamps, saved-tensor bytes,
recomputes) with `resolve.resolve` to turn each into a `records.Sample` off the hot path, and
`records.Structure`s from the untimed structure pass (`structure_pass`, `structure_driver`,
`flops`, `slots`) or derived from a timed step's own forward (`step_dataflow`).
`hooks.Capture` installs and removes the hooks; clocks, device memory, static memory
(parameters, gradients, optimizer state), NVTX ranges, the private autograd
entry points and the model-wrapper helpers live beside it. Imports `records` only.
"""
