"""The module graph: which calls fed which, and the FLOPs of each call.

The untimed structure pass (`structure_pass`, its FLOP count `flops` and the tensor slots of
a call's inputs and outputs `slots`) and the driver deciding when a pass runs
(`structure_driver`); the graph a timed step derives from its own forward (`step_dataflow`);
the graph of a compiled model traced on fake tensors (`fake_structure`). May import
`capture.step`, `capture.model`, `capture.forward`, `capture.memory` (the root's name, the
model index), the leaves at the top of `capture/`, `records` and the base modules; what it
reads of the step session, which sits above, it names as a protocol (`TimedStep`).
"""
