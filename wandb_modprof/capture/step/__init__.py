"""The sampled step's machinery that every kind of capture shares.

The clock whose stamps every hook takes (`clock`) and what our hooks cost outside their bodies
(`hook_cost`), Python's garbage collector held off inside the timed windows (`gc_pause`) and
the collections that still ran charged to the calls they paused (`gc_watch`), every private
torch API the package uses, in one place (`torch_private`), room on Python's stack for our hook
frames (`stack_room`) and which models carry our hooks (`registry`). The lowest layer of the
capture: imports only `capture.options` and `capture.inert_hook` (leaves at the top of
`capture/`), `records` and the base modules, never another sub-package.
"""
