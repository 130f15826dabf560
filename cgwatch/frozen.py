"""Internal. Immutable value classes without the `dataclasses` module, whose import costs
~5 ms of `import cgwatch` (it imports inspect, and so ast, dis, tokenize...) and whose every
frozen class another ~0.2 ms to generate its methods.

A subclass names its fields in `_fields`, in its `__init__`'s order, and its hand-written,
typed `__init__` (mypy checks every construction against it) takes one parameter per field,
named as the field, and sets them all with `fill(self, locals())`; an `__init__` that works a
value out first sets that field with `setter` (`object.__setattr__`). The base
gives what `@dataclass(frozen=True)` gave: `==` and `hash()` over the compared fields (class
and values), a `Name(field=value, ...)` repr, no assignment or deletion (AttributeError),
`replace()`, and pickling/copying. A subclass with `__slots__` has no `__dict__`; one without
keeps an instance `__dict__` holding exactly its fields, in order (Status and LevelInfo: code
and JSON output use `status.__dict__`).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar, TypeVar

    _F = TypeVar("_F", bound="Frozen")

setter = object.__setattr__  # how an __init__ sets a field of its (frozen) instance


def fill(obj: Frozen, values: dict[str, Any]) -> None:
    """Set every field of a new `obj` from the `locals()` of its `__init__`, whose parameters
    are named as the fields: the one line each value class's `__init__` needs, in place of a
    `setter` line per field. It costs construction only, never a query (a Snapshot is built
    on a change; queries read its slots): 970 -> 1572 ns for a 12-field Snapshot, 1421 ->
    2350 ns for a 17-field LevelInfo against a line per field (timeit, best of 15, Python
    3.11 here); `python -m bench.ab --quick` before -> after: available_memory() 0.98-1.04x."""
    for name in obj._fields:
        setter(obj, name, values[name])


class Frozen:
    __slots__ = ()
    _fields: ClassVar[tuple[str, ...]] = ()
    # What ==, hash() and repr() look at: every field unless the class says otherwise (the
    # way dataclasses' field(compare=False, repr=False) left one out).
    _compared: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "_compared" not in cls.__dict__:
            cls._compared = cls._fields

    def _key(self) -> tuple[Any, ...]:
        return tuple([getattr(self, name) for name in self._compared])

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            assert isinstance(other, Frozen)
            return self._key() == other._key()
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._compared)
        return f"{self.__class__.__qualname__}({shown})"

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        return self.__class__, tuple([getattr(self, name) for name in self._fields])

    def as_dict(self) -> dict[str, Any]:
        """Every field by name, in order."""
        return {name: getattr(self, name) for name in self._fields}


def replace(obj: _F, **changes: Any) -> _F:
    """A copy of `obj` with `changes` (as dataclasses.replace: an unknown name is a
    TypeError from the class's __init__)."""
    values = {name: getattr(obj, name) for name in obj._fields}
    values.update(changes)
    cls: Any = obj.__class__
    made: _F = cls(**values)
    return made
