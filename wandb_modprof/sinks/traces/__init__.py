"""Traces: a profile's last sample as Chrome / Perfetto trace events.

Holds the export (`trace`), the events of a sample's calls and their nesting (`trace_events`)
and the merge of those events into a torch.profiler trace (`trace_merge`). May import the
shared helpers of `sinks` (`files`); no other destination imports it.
"""
