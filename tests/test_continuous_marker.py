"""The marker of an open epoch on the task's side, over a real socket pair (no Spark): a task
waits for its checkpoint's `Marker` (`MarkerWait`), ignores an older checkpoint's or another
run's, reads frames that arrive in pieces (`TaskChannel.poll`), and ends the epoch when the
driver says `Stop` or goes away."""

from __future__ import annotations

import socket
import threading
import time

from regional.runtime.channel import Marker, Stop, TaskChannel, frame
from regional.runtime.continuous import MarkerWait


def _pair() -> tuple[TaskChannel, socket.socket]:
    task, driver = socket.socketpair()
    return TaskChannel(task), driver


def test_only_the_checkpoints_own_marker_closes_the_epoch() -> None:
    channel, driver = _pair()
    wait = MarkerWait(channel, "run", 7)
    assert wait(0.0) is False  # nothing there yet: no waiting
    driver.sendall(frame(Marker("run", 6)) + frame(Marker("other-run", 7)))
    assert wait(0.05) is False  # an older checkpoint's and another run's are not it
    data = frame(Marker("run", 7))
    driver.sendall(data[:3])  # a frame in pieces
    assert wait(0.0) is False
    threading.Timer(0.05, lambda: driver.sendall(data[3:])).start()
    started = time.monotonic()
    assert wait(5.0) is True  # woken by the rest of the frame, not by the 5 s
    assert time.monotonic() - started < 4 and not wait.stop


def test_stop_or_a_driver_gone_close_the_epoch_and_end_the_task() -> None:
    channel, driver = _pair()
    wait = MarkerWait(channel, "run", 1)
    driver.sendall(frame(Stop("run", "closing")))
    assert wait(1.0) is True and wait.stop
    channel, driver = _pair()
    wait = MarkerWait(channel, "run", 1)
    driver.close()
    assert wait(1.0) is True and wait.stop
