"""Records: the plain, frozen data the stages above the capture speak (no hooks, no I/O).

The capture hands the statistics stage its own plain, frozen record of each finished step
(`capture.session_record.SessionRecord`: it holds capture types), which `capture.resolve`
turns into these; from there on every boundary carries records from here.

Takes nothing; gives the types every other stage speaks: one `InvocationRecord` per module
call of a sample and the `Sample` holding them (`sample`), running statistics per call key
(`ModuleStats`, `RunningStat`), the structure pass's call tree and dataflow edges (`calls`),
the per-view graph types the layout draws (`graph`), the analysis modes of the panel
(`modes`), per-rank statistics of a distributed run (`ranks`) and `ProfileData`, one frozen
reading of a whole profile that every sink takes (`snapshot`). Imports only `_errors`.
"""
