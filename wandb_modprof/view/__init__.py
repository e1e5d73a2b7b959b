"""The view stage: from captured structures and statistics to the flat table the sinks draw.

In data-flow order: `graphs` (merge the structure passes; one `ViewGraph` per view),
`reduce` (fit the views into the row budget), `layout` (boxes and edge paths in pixels, with
`geometry`, `layering`, `placement` and `routing`), then `meta`, `rows`, `values` and `ranks`
(the table's rows and cells, in the schema of `columns`). `table.build_table` runs them all.
"""
