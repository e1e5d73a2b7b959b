"""The HTML report and the pictures: the panel's spec with a profile's table, offline.

Holds the self-contained page (`html`, its jinja2 `templates/`, the Vega runtime it inlines:
`vega_bundle`, the notes under its table: `table_notes`, several profiles as its runs: `runs`)
and SVG / PNG pictures of the same chart (`images`). May import the shared helpers of `sinks`
(`spec`, `units`, `escape`, `files`); the W&B destination logs its page.
"""
