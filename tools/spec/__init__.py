"""The panel's Vega spec, one module per section of the spec: `signals`, `data` (+ `lists`),
`scales`, and the marks `sidebar`, `graph`, `top_bar`; `expressions` holds the Vega expressions
they share (values, missing cells, the unit formatters mirroring `wandb_modprof.sinks.units`),
`theme` the geometry, fonts and colours, `marks` the encode helpers. `tools/build_spec.py`
assembles and writes them."""
