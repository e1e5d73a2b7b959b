"""Backward time per module call, from stamps on the autograd nodes each call created.

The nodes a sampled step hooked, in parallel lists (`nodes`); the step session's backward
half, an object the session holds (`node_stamps`): hooking the nodes as calls return, charging
each to its call and stamping each as it runs; forwards run again by activation checkpointing
during the backward (`recompute`), and what checkpointing costs per call beyond that rerun on
this host (`checkpoint_cost`, for the checkpoint planner); and the NVTX ranges of forward calls
and backward nodes (`nvtx`), which the node stamps close. May import every other sub-package
(`step`, `model`, `forward`, `memory`, `structure`), the leaves at the top of `capture/`,
`records` and the base modules.
"""
