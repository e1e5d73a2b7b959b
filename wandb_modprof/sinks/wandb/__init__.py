"""The W&B destination: what `watch` logs to a run and how the panel is registered.

Holds the log of a sample (`wandb_log`: the table as a `wandb.Table`, the HTML report, the
profile file as an artifact), the table's W&B copy (`wandb_table`, `packed`: one text cell per
row, the columns the spec reads), the run found or attached (`wandb_run`, `wandb_attach`), what a
log is filed under (`wandb_names`: the model's key, the preset, the artifact), the entries of
a log row (`wandb_entry`) and the chart preset's registration (`chart`). May import the shared
helpers of `sinks` (`spec`, `units`, `escape`, `files`) and the other destinations whose output
a log carries (`report`, `file`); nothing imports it but `api`.
"""
