"""The submission context of one device (drm_sched's submit_wq), and its worker.

run_job (job.py), which hands a job to the hardware, happens only in the device's
submission context, and there is one per device: the thread that holds the device's
lock while it calls a scheduler's schedule(). The device lock is the submission lock,
so exactly one thread at a time acts as the submission context. Only two kinds of
thread ever do:

- a thread submitting a job (KmdDevice._submit), for the job it pushes and whatever else
  the scheduler can run with it; this is the fast path of a short job on an idle ring,
  which then runs to completion on that thread (job.py);
- the device's submission worker ("gpu<N>.submit"), which the other threads queue work
  to: the interrupt's top half (a job completed while others are queued on that ring),
  a dependency's signal (KmdDevice.wake), the completion of a buffer move (evict.py), and
  the device's timers, which the worker runs itself: job timeouts with their recovery,
  whose resubmission of innocent jobs is a run_job too, and BAND's time buffer (tdr.py).

So the top half (irq.py, KmdDevice._retire_fence_irq) retires fences and marks jobs done, with
the scheduler's accounting; it never calls run_job. An engine thread never writes a ring,
waits for ring space or moves a buffer. Queued schedulers are coalesced: a completion
while its scheduler is already queued adds nothing, and one that leaves no job queued on
its ring costs no handoff at all.
"""

from __future__ import annotations

import logging
import queue
import threading

log = logging.getLogger("pvgpu.kmd")


class SubmitQueue:
    """The work queue and worker thread of one device's submission context. The worker
    runs queued schedulers' schedule() and, whenever `timer_due` (device ns) has come,
    the device's timer pass (KmdDevice._timer_pass -> the next deadline, or None).
    Queueing is a put on a SimpleQueue (no Python-level lock round trip), deduplicated
    through `_queued`: the worker forgets a scheduler before it schedules it, so a
    completion that finds it still queued is seen by that schedule()."""

    def __init__(self, device, tick_ns: int):
        self.device = device
        self.tick_ns = tick_ns  # the timer pass runs at least this often
        # schedulers to schedule, (fn, args) to call; None: just wake up
        self._wakeups = queue.SimpleQueue()
        self._queued = {}  # GpuScheduler -> None: put and not yet taken by the worker
        self._timer_lock = threading.Lock()
        self._stop = False
        self.timer_due = 0  # device time of the next timer pass (first: at once)
        self.thread = None
        self.handoffs = 0  # schedulers queued to the worker

    def start(self) -> None:
        self.thread = threading.Thread(target=self._worker, daemon=True,
                                       name=f"gpu{self.device.index}.submit")
        self.thread.start()

    def stop(self, timeout: float) -> None:
        self._stop = True
        self._wakeups.put(None)
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout)

    def queue(self, sched) -> None:
        """Have the worker call sched.schedule() (any thread; no-op if already queued)."""
        if sched in self._queued:
            return
        self._queued[sched] = None
        self.handoffs += 1
        self._wakeups.put(sched)

    def call(self, fn, *args) -> None:
        """Have the worker call fn(*args) (any thread), before it schedules what is queued."""
        self._wakeups.put((fn, args))

    def arm(self, deadline: int) -> None:
        """Run the timer pass by `deadline` (device ns). Called with the device lock held,
        so a timer pass cannot miss the deadline between its scan and this call."""
        if deadline >= self.timer_due:
            return
        with self._timer_lock:
            if deadline >= self.timer_due:
                return
            self.timer_due = deadline
        self._wakeups.put(None)

    def _call(self, fn, args) -> None:
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - the submission context must survive anything
            log.exception("gpu%d: submission worker call %r", self.device.index, fn)

    def _schedule(self, scheds) -> None:
        dev = self.device
        with dev.lock:
            if dev.stopped:
                return
            now = dev.clock_ns()
            for sched in scheds:
                sched.schedule(now)
                dev._arm_timer(sched)
            signals = dev._take_signals()
        dev._signal(signals)

    def _timers(self, now: int) -> None:
        with self._timer_lock:  # an arm() during the pass lowers it again
            self.timer_due = now + self.tick_ns
        deadline = self.device._timer_pass()
        if deadline is not None:
            with self._timer_lock:
                self.timer_due = min(self.timer_due, deadline)

    def _worker(self) -> None:
        dev = self.device
        wakeups = self._wakeups
        while not self._stop:
            try:
                now = dev.clock_ns()
                if now >= self.timer_due:
                    self._timers(now)
                    continue
                try:
                    item = wakeups.get(timeout=(self.timer_due - now) / 1e9)
                except queue.Empty:
                    continue
                scheds, calls = [], []
                while True:
                    if type(item) is tuple:
                        calls.append(item)
                    elif item is not None and self._queued.pop(item, 0) is None:
                        scheds.append(item)
                    if wakeups.empty():
                        break
                    item = wakeups.get_nowait()
                for fn, args in calls:
                    self._call(fn, args)
                if scheds and not self._stop:
                    self._schedule(scheds)
            except Exception:  # noqa: BLE001 - the submission context must survive anything
                log.exception("gpu%d: submission worker", dev.index)
