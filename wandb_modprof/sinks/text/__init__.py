"""Text for people and CI: the terminal summary, two profiles compared, the regression gate.

Holds each mode's values read from a profile (`values`), the ranked summary (`summary`), the
per-module comparison of two profiles (`compare`) and the gate that fails a CI job on a slower
module (`regression`). May import the shared helpers of `sinks` (`escape`) and `view.units`;
no other destination imports it.
"""
