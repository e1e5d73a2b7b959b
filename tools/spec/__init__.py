"""The panel's Vega spec, one module per section of the spec: `signals`, `data` (+ `lists`,
which gathers the texts around the graph: the hover card's lines `card_lines`, the ranked list
`ranked`, with `transforms` they share), `scales`, and the marks `sidebar` (+ `sidebar_lists`),
`graph`, `strip` (+ its `lanes`), `top_bar` and the hover `card`; `expressions` holds the Vega
expressions they share (values, missing cells, the unit formatters mirroring
`wandb_modprof.view.units`), `theme` the geometry, fonts and colours, `marks` the encode
helpers. `tools/build_spec.py` assembles and writes them."""
