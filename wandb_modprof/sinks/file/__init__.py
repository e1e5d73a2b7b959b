"""The profile file: the versioned JSON a profile is saved as and loaded from.

Holds writing and reading (`profile_file`: the header, the versions), the layout of version 8
(`profile_tables`: records as tables of columns; `profile_columns`: how a column is written;
`profile_statistics`: the running statistics per metric), the JSON encoding of records as
objects (`profile_encode`, version 7's layout and the records outside tables), the rules a
loaded file must meet (`profile_schema`, `profile_call_tree`, `profile_times`: a file from
anyone is checked before it becomes a `ProfileData`). May import the shared helpers of `sinks`
(`files` for atomic writes and path checks); the W&B destination saves through it.
"""
