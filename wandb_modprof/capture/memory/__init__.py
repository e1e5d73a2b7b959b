"""What a sampled step keeps in memory, and what the model holds between steps.

Bytes of the tensors autograd saves, counted per call by storage (`activations`, with
`storage` for the identity and size of a tensor's storage), the accelerator allocator's
counters read at hook boundaries (`device_memory`), and the parameter, buffer, gradient and
optimizer-state bytes and norms per module with the model index they are read from
(`static_memory`, `gradient_readings`), and the loss scale a GradScaler put in the gradients,
divided out of their norms (`loss_scale`). The step's memory curve is put together when a
session is resolved (`capture/memory_curve.py`, beside `resolve`). May import `capture.step`,
`capture.model`, the leaves at the top of `capture/`, `records` and the base modules; never
`forward`.
"""
