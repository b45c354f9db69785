"""``CallWrapper``: what the wrapped function sees of in-process restart (in this process).

How ``atomic()`` defers a restart requested meanwhile is tested with the interruptor in ``test_interruption.py``.
"""

from __future__ import annotations

import threading

from ft_core.inprocess import State
from ft_core.inprocess.call_wrapper import Atomic, CallWrapper
from ft_core.inprocess.interruption import DEFAULT_INTERRUPT_SIGNAL, Interruptor


class Stamps:
    """The main thread's progress as the wrapper sees it: something to stamp."""

    def __init__(self) -> None:
        self.count = 0

    def stamp(self) -> None:
        self.count += 1


def _wrapper(interruptor: Interruptor, progress: Stamps) -> CallWrapper:
    state = State(iteration=2, initial_rank=5, initial_world_size=8, rank=3, world_size=6)
    return CallWrapper(state, store=object(), progress=progress, interruptor=interruptor)  # type: ignore[arg-type]


def test_the_function_sees_its_iteration_rank_and_world_size_of_this_attempt():
    wrapper = _wrapper(Interruptor(DEFAULT_INTERRUPT_SIGNAL), Stamps())
    assert (wrapper.iteration, wrapper.rank, wrapper.world_size) == (2, 3, 6)


def test_ping_reports_progress_by_hand():
    progress = Stamps()
    wrapper = _wrapper(Interruptor(DEFAULT_INTERRUPT_SIGNAL), progress)
    wrapper.ping()
    wrapper.ping()
    assert progress.count == 2


def test_atomic_sections_nest_and_a_restart_request_waits_for_the_outer_one_to_end():
    interruptor = Interruptor(DEFAULT_INTERRUPT_SIGNAL)
    wrapper = _wrapper(interruptor, Stamps())
    granted = []
    requester = threading.Thread(target=lambda: granted.append(interruptor.request(threading.Event(), 0.01)))
    with wrapper.atomic() as outer:
        assert isinstance(outer, Atomic)
        with wrapper.atomic():
            requester.start()
        requester.join(0.2)
        assert requester.is_alive() and granted == []  # still inside the outer section
    requester.join(30)
    assert granted == [True]

