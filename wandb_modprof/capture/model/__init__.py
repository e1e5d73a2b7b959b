"""What the model is under its wrappers, before anything is measured on it.

The user's model inside a `DistributedDataParallel` wrapper, the user's class of an FSDP2
module and the wrappers measured only in part (`wrappers`); `torch.compile`'s wrapper, the
compiled regions and the hooks placed around a compiled call (`compiled`); a model on the meta
device, refused (`transforms`: what of `torch.func` is profiled). Read by the memory
walk (which parameters are whose), the structure pass, the hooks and the sinks (the class
name a W&B key is named after). Imports only `capture.inert_hook` (a leaf at the top of
`capture/`), `records` and the base modules, never another sub-package.
"""
