"""Views: a profile's module graph per nesting view, laid out and flattened into one table.

Takes a `records.ProfileData`; gives `table.ProfileTable`, the one long table of node / edge /
meta rows that the W&B panel, the HTML report and the pictures all draw. In data-flow order:
`graphs` (merge the structure passes; one `ViewGraph` per view), `reduce` (fit the views into
the row budget, merging nodes into `group_nodes`; the `reduced` note says what was dropped),
`layout` (boxes and edge paths in pixels, with `geometry`, `layering`, `placement` and
`routing`, on python-igraph), then `meta`, `rows`, `refs`, `values` and `ranks` (the table's
rows and cells, in the schema of `columns`; `refs` numbers the views and writes keys relative
to them). `table.build_table` runs them all. Numbers with their units are written one way
everywhere, by `units` (every sink and the checkpoint texts here). Imports `records`.
"""
