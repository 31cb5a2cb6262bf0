"""Where a unit's restored operator state comes from: a `StateProvider`.

A unit's epoch (`regional.dataflow.walker`, alone or in a pass) restores each
stateful operator subtask through one call, `restored_state`, from the state the coordinator
named for it (`SubtaskState.handles`). Today's provider decodes the state's bytes
(`FromBytes`: `Operator.restore`); the runtime's hot provider (`regional.runtime.hot_state`)
gives back the decoded state a worker kept from the epoch that wrote exactly those bytes, and
decodes the bytes otherwise. Either gives the same state: the hot one is the state the bytes
were encoded from.

A plain function from a subtask to its bytes and where they are (`StateBytes`) is a provider
too: `restored_state` decodes what it returns.
"""

from __future__ import annotations

from collections.abc import Callable

from metadata.model import SubtaskState
from regional.dataflow.operators import Operator
from regional.dataflow.state import OperatorState
from regional.dataflow.state_codec import StateCodec

__all__ = ["FromBytes", "StateBytes", "StateProvider", "restored_state"]

#: An operator subtask's restored state bytes and a description of where they are (for errors).
StateBytes = Callable[[SubtaskState], tuple[bytes, str]]


class StateProvider:
    """Restores an operator subtask's state from the state the coordinator named for it."""

    def restore(
        self, operator: Operator, subtask: SubtaskState, codec: StateCodec
    ) -> OperatorState | None:
        """`operator`'s state in `subtask` (None for a stateless operator); raises what
        decoding raises (a `StateDecodeError` naming the state file)."""
        raise NotImplementedError


class FromBytes(StateProvider):
    """Decodes the state's bytes, read by `read`, every time (`Operator.restore`)."""

    def __init__(self, read: StateBytes) -> None:
        self.read = read

    def restore(
        self, operator: Operator, subtask: SubtaskState, codec: StateCodec
    ) -> OperatorState | None:
        data, where = self.read(subtask)
        return operator.restore(data, codec=codec, source=where)


def restored_state(
    states: StateProvider | StateBytes,
    operator: Operator,
    subtask: SubtaskState,
    codec: StateCodec,
) -> OperatorState | None:
    """`operator`'s restored state in `subtask`, from `states` (a provider, or a function
    giving the state's bytes, decoded here)."""
    if isinstance(states, StateProvider):
        return states.restore(operator, subtask, codec)
    data, where = states(subtask)
    return operator.restore(data, codec=codec, source=where)
