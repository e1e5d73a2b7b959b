"""The ranked list (dataset `top`): the modules that cost most in the current mode, each with
its value, its share and a name short enough for its column that still tells it apart from the
others listed. Its marks are in `sidebar_lists`."""

from __future__ import annotations

from tools.spec.data import Data, _filter, _formula
from tools.spec.expressions import IN_PLAN, fmt

TOP_NAME_CHARS = 16  # a ranked entry's name, at most (its column is 100 px)


def top() -> Data:
    most = TOP_NAME_CHARS + 4  # a name made longer to tell it apart (the label gives way)

    def _cut_at_dot(tail: str) -> str:
        """`tail` from after its first dot (a whole dotted suffix), or whole if it has none."""
        dot = f"indexof({tail}, '.')"
        return f"({dot} >= 0 && {dot} < length({tail}) - 1 ? substring({tail}, {dot} + 1) : {tail})"

    return {
        "name": "top",
        "source": "nodes_all",
        "transform": [
            # modules only: a group node ("7804 more modules") holds the sum of many and would
            # rank first, above the modules it is not
            _filter("datum.node_kind === 'module'"),
            _formula("v", "datum['v_' + mode]"),
            _filter("isValid(datum.v)"),
            # the order: the value, or what the mode ranks by (`Mode.rank_by`: the efficiency
            # mode by the time lost to the roofline), which the value column then shows
            _formula("r", "mode_rank_label ? datum['r_' + mode] : datum.v"),
            _filter("isValid(datum.r)"),
            {
                "type": "window",
                "sort": {"field": ["r", "node_key"], "order": ["descending", "ascending"]},
                "ops": ["row_number"],
                "as": ["rank"],
            },
            _filter("datum.rank <= top_n"),
            _formula(
                "value_text",
                f"mode_rank_label ? ({fmt('mode_rank_unit', 'datum.r')}) : "
                f"({fmt('mode_unit', 'datum.v')})",
            ),
            # the share in its own narrow column: "86%" from 10 % up, "7.1%" below; a mode
            # ranked by something else shows its value there ("23%" of the roofline)
            _formula(
                "share_text",
                # (an efficiency under 1 % in a column 34 px wide: "<1%", the card has it exact)
                f"mode_rank_label ? (mode_unit === 'percent' && datum.v < 1 ? '<1%' : "
                f"({fmt('mode_unit', 'datum.v')})) : "
                "isValid(tot[mode_total]) && tot[mode_total] > 0 ? format(datum.v / "
                "tot[mode_total], datum.v >= 0.1 * tot[mode_total] ? '.0%' : '.1%') : ''",
            ),
            _formula("who", "datum.module_name || datum.label"),
            # The name shown: what tells this entry apart from the others listed. Each listed
            # entry is crossed with the depths of its dotted suffixes ("experts.1", then
            # "0.experts.1", ...); a suffix no other entry has is unique, and the entry's
            # shortest unique one (`uniq_d` parts) must show. Within `TOP_NAME_CHARS` the
            # name keeps its end as before, cut at a dot ("transformer.h.0.mlp.c_fc" ->
            # "…h.0.mlp.c_fc"); where that tail is not unique (MoE: "…experts.1" of every
            # layer) the unique suffix shows, up to `most` characters, longer ones keeping the
            # part that differs and the name's end: "layers.0…experts.1". The full name:
            # the entry's tooltip (`sidebar_lists.py`) and, clicked, the card.
            _formula("parts", "split(datum.who, '.')"),
            _formula("np", "length(datum.parts)"),
            _formula("depth", "sequence(1, datum.np + 1)"),
            {"type": "flatten", "fields": ["depth"]},
            _formula("suffix", "join(slice(datum.parts, -datum.depth), '.')"),
            {"type": "joinaggregate", "groupby": ["suffix"], "ops": ["count"], "as": ["n_same"]},
            # (the tail kept within TOP_NAME_CHARS: the whole name, or a suffix of at most
            # one character less, for the "…" before it)
            _formula(
                "fit",
                f"length(datum.suffix) <= {TOP_NAME_CHARS - 1} || (datum.depth === datum.np "
                f"&& length(datum.who) <= {TOP_NAME_CHARS}) ? datum.depth : 0",
            ),
            _formula("uniq", "datum.n_same === 1 ? datum.depth : datum.np"),
            {
                "type": "joinaggregate",
                "groupby": ["rank"],
                "ops": ["max", "min"],
                "fields": ["fit", "uniq"],
                "as": ["fit_d", "uniq_d"],
            },
            _filter("datum.depth === datum.np"),  # one row per entry again: the whole name's
            # a unique part that is an index ("0" of "layers.0.experts.1") says more with the
            # name of its container before it: "layers.0"
            _formula(
                "need",
                "datum.uniq_d < datum.np && test(regexp('^[0-9]+$'), "
                "datum.parts[datum.np - datum.uniq_d]) ? datum.uniq_d + 1 : datum.uniq_d",
            ),
            _formula("tail", f"slice(datum.who, -{TOP_NAME_CHARS})"),
            _formula("kept", f"'…' + {_cut_at_dot('datum.tail')}"),
            _formula("lead", "datum.need < datum.np ? '…' : ''"),
            _formula("need_s", "join(slice(datum.parts, -datum.need), '.')"),
            # the part that differs (with its container's name), and what follows it
            _formula(
                "head",
                "join(slice(datum.parts, datum.np - datum.need, datum.np - datum.uniq_d + 1), '.')",
            ),
            _formula("rest", "join(slice(datum.parts, datum.np - datum.uniq_d + 1), '.')"),
            _formula("room", f"{most} - length(datum.head) - 1"),
            _formula("rest_tail", "slice(datum.rest, -max(1, datum.room))"),
            # its end: whole parts, unless they leave most of the room unused (a long last
            # part: its last characters then)
            _formula("rest_cut", _cut_at_dot("datum.rest_tail")),
            _formula(
                "end",
                "length(datum.rest) <= datum.room ? datum.rest : "
                "2 * length(datum.rest_cut) >= datum.room ? datum.rest_cut : datum.rest_tail",
            ),
            _formula(
                "short_who",
                # the name fits, or its tail tells it apart (a last part too long for the
                # column, unique: its end, as before)
                f"length(datum.who) <= {TOP_NAME_CHARS} ? datum.who : "
                "datum.need <= datum.fit_d || (datum.fit_d === 0 && datum.need === 1) ? "
                "datum.kept : "
                f"length(datum.need_s) <= {most} ? datum.lead + datum.need_s : "
                "datum.rest === '' ? '…' + slice(datum.head, -" + str(most - 1) + ") : "
                "datum.room >= 3 ? datum.lead + datum.head + '…' + datum.end : "
                f"'…' + slice(datum.head, -{most - 2}) + '…'",
            ),
            # the same module called more than once: its entries differ by their call
            # ("enc #1"; the node key ends in "#<call>")
            _formula(
                "short_who",
                "datum.n_same > 1 ? datum.short_who + ' ' + "
                "replace(datum.node_key, regexp('^.*#'), '#') : datum.short_who",
            ),
            _formula(
                "rank_text",
                # the "Checkpoint value" mode marks the modules in the plan as the graph does
                f"datum.rank + '. ' + ({IN_PLAN} ? '○ ' : '') + datum.short_who",
            ),
        ],
    }
