"""Geometry, fonts and colours of the panel. The node boxes are sized by the layout stage for
its fonts (`wandb_modprof.view.layout`), so the node text uses the layout's constants."""

from __future__ import annotations

from wandb_modprof.view.layout import FONT_FAMILY, FONT_PX, SUBLABEL_FONT_PX

SIDE_W = 224  # sidebar width; the graph area starts at GX0
GX0 = 236
GY0 = 30  # breadcrumbs above the graph area
ROW = 15  # sidebar line height
FONT = FONT_FAMILY
NODE_FONT_PX = FONT_PX  # a node's label, at zoom 1
NODE_SUBLABEL_FONT_PX = SUBLABEL_FONT_PX  # its type line
TEXT_FONT_PX = 11  # sidebar entries, card, buttons
SMALL_FONT_PX = 10  # headings, colour bar labels, hint
TITLE_FONT_PX = 13  # model name, messages
CRUMB_FONT_PX = 12
CRUMB_CHAR_W_PX = 7.2  # breadcrumb width per character (+ 22 px of padding and separator)
CRUMB_ELLIPSIS_PX = 22  # the ellipsis standing for the breadcrumbs left out
HINT_CHAR_W_PX = 5.6  # the hint's width per character (10 px text)
MIN_READABLE_PX = 6  # a node whose label would be smaller than this at the zoom shows no text
MIN_TEXT_PX = 9  # no text is drawn smaller: a node's text grows to it, or is hidden
CARD_W = 250
CARD_LINE_PX = 14
INK = "#222222"
MUTED = "#777777"
DISABLED = "#aaaaaa"
ACTIVE_FILL = "#e8eefc"
NO_VALUE_FILL = "#e3e3e3"  # a module whose value in this mode was not measured
PORT_FILL = "#ffffff"  # input / output nodes carry no measurements
MIN_TOP_ROWS = 5  # ranked entries a panel shows before it shows the totals
MAX_RUNS = 10  # run entries listed; more are counted, not drawn
# Compare mode: log2(ratio) is normalised by max(|log2 ratio|) over the view, but never by less
# than log2(1.25), so run-to-run noise of a few percent stays pale instead of saturating, and
# never by more than log2(8), so one outlier does not wash out every other node.
MIN_RATIO_SPAN = 0.32192809488736235  # log2(1.25)
MAX_RATIO_SPAN = 3.0  # log2(8): a ratio beyond 8x (e.g. a cold first step) saturates
DIVERGE = ["#3b4cc0", "#f2f2f2", "#b40426"]  # faster than baseline / same / slower
