"""Dependency graphs of siblings (agents of a run, tasks of an agent, steps of a task):
cycles to report, and what is guaranteed to have finished before each child starts."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator


def strongly_connected(depends: dict[str, list[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of a dependency graph, iteratively.

    Dependencies that are not keys of ``depends`` are ignored (reported elsewhere).
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    for root in depends:
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work: list[tuple[str, Iterable[str]]] = [(root, iter(depends[root]))]
        while work:
            node, children = work[-1]
            descended = False
            for child in children:
                if child not in depends:
                    continue
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(depends[child])))
                    descended = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if descended:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(component)
    return components


def find_cycles(depends: dict[str, list[str]], order: list[str] | None = None) -> list[list[str]]:
    """One cycle per group of names that depend on each other, first name repeated last.

    Each cycle starts at the member that comes first in ``order`` (default: the order of
    ``depends``) and is a shortest way back to it: ``["a", "b", "a"]`` reads "a depends
    on b, which depends on a".
    """
    rank = {name: i for i, name in enumerate(order if order is not None else depends)}
    cycles: list[list[str]] = []
    for component in strongly_connected(depends):
        if len(component) < 2:
            continue  # self-dependencies never enter the graph
        members = set(component)
        start = min(component, key=lambda name: rank.get(name, len(rank)))
        came_from: dict[str, str] = {}
        frontier = [start]
        closing = ""
        while frontier and not closing:
            following: list[str] = []
            for node in frontier:
                for dep in depends[node]:
                    if dep == start:
                        closing = node
                        break
                    if dep in members and dep not in came_from:
                        came_from[dep] = node
                        following.append(dep)
                if closing:
                    break
            frontier = following
        path = [start]
        node = closing
        while node != start:
            path.append(node)
            node = came_from[node]
        path.append(start)
        # `path` walks the cycle backwards from `start`; read it forwards.
        cycles.append([start, *reversed(path[1:-1]), start])
    cycles.sort(key=lambda cycle: rank.get(cycle[0], len(rank)))
    return cycles


class Finished(Collection[str]):
    """The sibling names guaranteed to have finished before one child starts.

    A bitmask over the siblings' positions, so a long dependency chain costs a few
    kilobytes rather than a set per child (5,000 steps in a chain would be 12.5 million
    set entries).
    """

    __slots__ = ("_extra", "_index", "_mask")

    def __init__(self, index: dict[str, int], mask: int, extra: frozenset[str] = frozenset()):
        self._index = index
        self._mask = mask
        self._extra = extra

    def __contains__(self, name: object) -> bool:
        if name in self._extra:
            return True
        position = self._index.get(name) if isinstance(name, str) else None
        return position is not None and bool(self._mask >> position & 1)

    def __iter__(self) -> Iterator[str]:
        yield from self._extra
        yield from (
            n for n, i in self._index.items() if self._mask >> i & 1 and n not in self._extra
        )

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def including(self, name: str) -> Finished:
        return Finished(self._index, self._mask, self._extra | {name})


def finished_before(mode: str, names: list[str], depends: dict[str, list[str]]) -> list[Finished]:
    """For each child (by position), the siblings guaranteed to finish before it starts:
    the earlier ones when sequential, none when parallel, its transitive dependencies in
    a dag (cycles and dangling names are reported elsewhere and simply ignored here)."""
    index: dict[str, int] = {}
    for position, name in enumerate(names):
        if name:
            index.setdefault(name, position)
    if mode == "sequential":
        return [Finished(index, (1 << position) - 1) for position in range(len(names))]
    if mode != "dag":
        return [Finished(index, 0) for _ in names]
    masks: dict[str, int] = {}
    seen: set[str] = set()
    for root in depends:
        if root in seen:
            continue
        seen.add(root)
        work: list[tuple[str, Iterable[str]]] = [(root, iter(depends[root]))]
        while work:  # depth-first, iteratively: a long chain must not hit the recursion limit
            node, deps = work[-1]
            for dep in deps:
                if dep in depends and dep not in seen:
                    seen.add(dep)
                    work.append((dep, iter(depends[dep])))
                    break
            else:
                work.pop()
                mask = 0
                for dep in depends[node]:
                    if dep in index:
                        mask |= masks.get(dep, 0) | 1 << index[dep]
                masks[node] = mask
    return [Finished(index, masks.get(name, 0)) for name in names]
