"""Views: a profile's module graph per nesting view, laid out and flattened into one table.

Takes a `records.ProfileData`; gives the graph of each view (a module's children, their
dataflow edges and its input / output slots: `graphs`), node boxes and edge paths per view
from a layered layout in python-igraph (`layout`), and `table.ProfileTable`, the one long
table of node / edge / meta rows (reduced to a row budget, the `reduced` note saying what was
dropped) that the W&B panel, the HTML report and the pictures all draw. Imports `records`.
"""
