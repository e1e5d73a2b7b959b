"""Statistics: samples folded into running statistics per call key, and the live profile.

Takes what the capture hands over (`capture.sink.SampleSink`: finished step sessions as plain
records, `capture.session_record.SessionRecord`, to resolve; structure passes); gives running
count / mean / std / min / max / last of every metric per call key (`running.StatsAccumulator`,
Welford) and `accumulator.ProfileAccumulator`, which resolves the records lazily, keeps
structures and per-rank data, and freezes all of it into one `records.ProfileData`
(`snapshot()`) for the views and sinks. Imports `records` and `capture`.
"""
