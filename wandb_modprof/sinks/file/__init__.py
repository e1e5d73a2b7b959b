"""The profile file: the versioned JSON a profile is saved as and loaded from.

Holds writing and reading (`profile_file`), the JSON encoding of records (`profile_encode`),
the rules a loaded file must meet (`profile_schema`, `profile_times`: a file from anyone is
checked before it becomes a `ProfileData`). May import the shared helpers of `sinks` (`files`
for atomic writes and path checks); the W&B destination saves through it.
"""
