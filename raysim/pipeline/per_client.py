"""Per-client state as a persistent mapping made of plain content: a radix tree of dicts over the
digits of the client id in base :data:`FANOUT`, ``levels`` deep (:func:`levels_for`; one level
for at most FANOUT clients: ``{client id: value}`` itself).

:func:`updated` gives a new tree with some clients' values set and leaves the old one as it was:
it copies only the nodes on those clients' paths and shares every other node, so a stage's step
costs what the step's clients cost (times the depth), never a copy of every client's entry.
Nested dicts of tensors, the tree saves and loads whole with the run state."""

from __future__ import annotations

FANOUT = 64  # children of a node


def levels_for(num_clients: int) -> int:
    """The depth of a tree that holds client ids 0 … ``num_clients`` − 1."""
    levels, reach = 1, FANOUT
    while reach < num_clients:
        levels, reach = levels + 1, reach * FANOUT
    return levels


def _path(client: int, levels: int) -> list:
    """The digits of ``client``, most significant first."""
    return [client // FANOUT ** (levels - 1 - i) % FANOUT for i in range(levels)]


def value_of(tree: dict, client: int, levels: int, default=None):
    """The value ``tree`` holds for ``client`` (``default`` when none)."""
    *inner, last = _path(client, levels)
    node = tree
    for digit in inner:
        node = node.get(digit)
        if node is None:
            return default
    return node.get(last, default)


def items(tree: dict, levels: int):
    """Every (client id, value) ``tree`` holds, in client-id order."""
    if levels == 1:
        yield from sorted(tree.items())
        return
    for digit, child in sorted(tree.items()):
        for client, value in items(child, levels - 1):
            yield digit * FANOUT ** (levels - 1) + client, value


def updated(tree: dict, values: dict, levels: int) -> dict:
    """A new tree: ``tree`` with ``values`` ({client id: value}) set; ``tree`` is left as it was."""
    root = dict(tree)
    made = {id(root)}  # nodes this call copied: set in place
    for client, value in values.items():
        *inner, last = _path(client, levels)
        node = root
        for digit in inner:
            child = node.get(digit)
            if child is None or id(child) not in made:
                child = {} if child is None else dict(child)
                made.add(id(child))
                node[digit] = child
            node = child
        node[last] = value
    return root
