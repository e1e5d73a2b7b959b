"""Call keys that name the same work on every step, even when calls are routed per step.

A key is what the statistics fold samples under, so two calls on two steps share a key only if
they are the same work. Counting calls per module name per step (`act_fn#3`) breaks that as
soon as a module is shared: with one `act_fn` module used by every expert of a mixture of
experts, the fourth call is whichever expert the router picked fourth on that step.

The rule (one table for the timed session, the structure pass and the graph a timed step
derives, so the three always agree):

* a **nested** call, made by the first call of a module that contains it in the module tree
  (the root's call included), keeps the plain key `"<name>#<k>"`, `k` counting such calls of
  that name in the step. Every call of an ordinary model is nested (a `ModuleList` in
  between, as in `transformer.h.0` called by `transformer`, does not matter), so its keys are
  unchanged: `layer1.0.relu#1` is still the second call of that ReLU.
* any other call, made by a module that does not contain it (a shared module: `moe.act_fn`
  called by `moe.experts.3`) or by a later call of its container (`block#1` running
  `block.fc` again), is keyed under its caller: `"<caller key> > <name>#<j>"`, `j` counting
  calls of that name within that one caller call. `moe.experts.3#0 > moe.act_fn#0` is expert
  3's activation on every step, whichever other experts ran.
* a module calling itself (recursion, a root that calls itself on a smaller input) is nested
  in its own call, and its recursive calls count as first calls for their children: the
  depth of the recursion is the same work on every step, and keys stay `conv#1`, not a chain
  of prefixes that grows with the depth.

A prefixed key is stable whenever its caller's key is, so keys under keys (a shared module's
own children) stay stable too. `" > "` separates because it is printable (terminal, SVG and
the panel show it as is), cannot occur in a qualified name without a module name that itself
holds it, and does not start with a mark of the table's relative references (`view/refs.py`).

>>> keys = CallKeys()
>>> [keys.enter("<root>", -1), keys.enter("moe.experts.3", 0), keys.enter("moe.act_fn", 1)]
[('<root>#0', 0), ('moe.experts.3#0', 0), ('moe.experts.3#0 > moe.act_fn#0', 0)]
"""

from __future__ import annotations

KEY_SEPARATOR = " > "


class CallKeys:
    """The keys of one forward's calls, handed out in call order (`enter`, preorder)."""

    __slots__ = ("_first", "_keys", "_names", "_nested", "_within")

    def __init__(self) -> None:
        self._names: list[str] = []  # per call, in order: module name
        self._keys: list[str] = []
        self._first: list[bool] = []  # per call: its children may be nested (see the rule)
        self._nested: dict[str, int] = {}  # module name -> nested calls so far in the step
        self._within: dict[tuple[int, str], int] = {}  # (caller, name) -> calls so far

    def enter(self, name: str, caller: int) -> tuple[str, int]:
        """The key and call index of a new call of module `name` made by call `caller` (its
        position in call order; -1 for the root's outermost call)."""
        caller_name = self._names[caller] if caller >= 0 else ""
        if caller < 0 or (
            self._first[caller]
            # the root contains every module (its children's names have no prefix)
            and (
                caller_name == self._names[0]
                or name == caller_name
                or name.startswith(caller_name + ".")
            )
        ):
            k = self._nested.get(name, 0)
            self._nested[name] = k + 1
            key = f"{name}#{k}"
            first = k == 0 or name == caller_name  # recursion: see the rule
        else:
            slot = (caller, name)
            k = self._within.get(slot, 0)
            self._within[slot] = k + 1
            key = f"{self._keys[caller]}{KEY_SEPARATOR}{name}#{k}"
            first = False  # its children are keyed under it: it is not the same call each step
        self._names.append(name)
        self._keys.append(key)
        self._first.append(first)
        return key, k
