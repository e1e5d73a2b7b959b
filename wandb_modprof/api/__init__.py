"""API: what users call, wiring the stages together (the top of the one-way data flow).

Takes a user's model, optimizer and W&B run; gives `watch` / `unwatch` and its `WatchHandle`
(sampling every `log_freq`-th step, logging to W&B), the `profile()` block, `Profile` (the
reading API over a `stats.ProfileAccumulator`, with the sinks as convenience methods) and
`load`, `on_module` callbacks at one module's forward / backward boundaries, the distributed
channel that gathers per-rank statistics to rank 0, the `wandb-modprof` CLI and the demo.
May import every stage below it.
"""
