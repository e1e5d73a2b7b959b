"""The module graph: which calls fed which, and the FLOPs of each call.

The untimed structure pass (`structure_pass`, the torch modes it runs under `pass_modes`, its
per-call bookkeeping `pass_frames`, its FLOP count `flops` and the tensor slots of a call's
inputs and outputs `slots`), when a pass is due and which graphs are kept (`pass_schedule`),
the driver running the passes (`structure_driver`) and the counts kept across them per call
(`kept_counts`); the graph a timed step derives from its own forward (`step_dataflow`); the
graph of a compiled model traced on fake tensors (`fake_structure`). May import
`capture.step`, `capture.model`, `capture.forward`, `capture.memory` (the root's name, the
model index), the leaves at the top of `capture/`, `records` and the base modules; what it
reads of the step session, which sits above, it names as a protocol (`TimedStep`, in
`pass_schedule`).
"""
