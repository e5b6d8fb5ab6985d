"""ImageEngine: one ImagePipeline run by one worker thread, fed by a priority queue.

    submit(req) --validate--> heap of (priority, arrival) --worker--> pipeline.generate(batch)
                                                                        -> each request's Future

Lower `priority` runs first, then arrival order, as the LLM scheduler's priority policy. A
pipeline is not thread-safe and a denoising step already uses every core, so one worker runs one
batch at a time. When it starts a batch it takes the first request and then every queued request
with the same pipeline.batch_key (size, steps, scheduler, guidance: what one UNet call must share),
in queue order, while the batch holds at most max_batch_images images: the UNet's time per step
grows less than linearly in the batch at small sizes, so compatible requests finish together
sooner than one after another. A compatible request of lower priority may ride along with a higher
one; it never delays it by more than the batch's extra width.

An error in a batch of several requests is retried request by request, so only the request that
raises fails and the engine goes on serving. Requests are validated against pipeline.limits
before they are queued, so a bad size or step count is refused at once, not after a wait.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import heapq
import itertools
import logging
import threading
import time
import uuid
from typing import TYPE_CHECKING, Callable

from tacit.engine.request_stream import EngineDeadError, QueueFullError

if TYPE_CHECKING:
    from tacit.diffusion.pipeline import ImagePipeline
    from tacit.diffusion.request import ImageRequest

logger = logging.getLogger("tacit.image_engine")

# Images in one UNet batch (CFG doubles it inside the pipeline). 4 is where SDXL's UNet step at
# 1024x1024 stops gaining from a wider batch on a CPU socket (its convolutions are already
# compute-bound at batch 2x2), and it bounds the latents' and activations' memory to 4 images.
DEFAULT_MAX_IMAGE_BATCH = 4
# Queued requests beyond this are refused (503) rather than left to wait minutes each.
DEFAULT_MAX_IMAGE_WAITING = 64

StepCallback = Callable[[int, int], None]


def native_size(pipeline: "ImagePipeline") -> tuple[int, int]:
    """(width, height) the model was trained at, what a request that names no size gets: the
    VAE's sample_size (SDXL 1024, SD 1.5 512)."""
    side = int(pipeline.components.vae.config.sample_size)
    return side, side


@dataclasses.dataclass(eq=False)
class _Job:
    request: "ImageRequest"
    future: concurrent.futures.Future
    on_step: StepCallback | None
    arrival: float


class ImageEngine:
    def __init__(
        self,
        pipeline: "ImagePipeline",
        max_batch_images: int = DEFAULT_MAX_IMAGE_BATCH,
        max_waiting: int = DEFAULT_MAX_IMAGE_WAITING,
    ) -> None:
        if max_batch_images < 1:
            raise ValueError(f"max_batch_images={max_batch_images}: must be at least 1")
        self.pipeline = pipeline
        self.max_batch_images = max_batch_images
        self.max_waiting = max_waiting
        self._heap: list[tuple[int, int, _Job]] = []
        self._order = itertools.count()  # arrival order, the tie-break between equal priorities
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.batches_run = 0  # batches the worker has started, for tests and logs

    @property
    def model_name(self) -> str:
        return self.pipeline.model_name

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    @property
    def num_waiting(self) -> int:
        with self._cond:
            return len(self._heap)

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the image engine is already started")
        self._thread = threading.Thread(target=self._run, name="tacit-image-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop after the batch in progress; queued requests fail with EngineDeadError."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def validate(self, request: "ImageRequest") -> None:
        """ValueError naming the field and its valid range, if the model cannot take the request."""
        self.pipeline.limits.validate(request)

    def submit(self, request: "ImageRequest", on_step: StepCallback | None = None) -> concurrent.futures.Future:
        """Validate and queue; the Future gets the ImageResult (or the error that request raised).
        on_step(step, total) is called on the worker thread after each denoising step of the batch
        the request is in. Cancelling the Future before its batch starts removes it from the queue."""
        self.validate(request)
        if not request.request_id:
            request = dataclasses.replace(request, request_id=f"img-{uuid.uuid4().hex}")
        job = _Job(request, concurrent.futures.Future(), on_step, time.perf_counter())
        with self._cond:
            if self._stopping or self._thread is None:
                raise EngineDeadError("the image engine is not running")
            if len(self._heap) >= self.max_waiting:
                raise QueueFullError(
                    f"{len(self._heap)} image requests are waiting, the most this server queues (--max-image-waiting); "
                    "retry later"
                )
            heapq.heappush(self._heap, (request.priority, next(self._order), job))
            self._cond.notify()
        return job.future

    # ---- the worker thread --------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    waiting, self._heap = [job for _, _, job in self._heap], []
                    break
                batch = self._take_batch()
            if batch:
                self.batches_run += 1
                self._generate(batch)
        for job in waiting:
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(EngineDeadError("the image engine stopped before this request ran"))

    def _take_batch(self) -> list[_Job]:
        """Under the lock: the first live request in (priority, arrival) order, then the queued
        requests sharing its batch_key, in the same order, while the images fit the batch.
        Requests cancelled while queued are dropped here (set_running_or_notify_cancel)."""
        ordered = sorted(self._heap)
        batch: list[_Job] = []
        key: tuple | None = None
        images = 0
        kept: list[tuple[int, int, _Job]] = []
        for entry in ordered:
            job = entry[2]
            if job.future.cancelled():
                continue
            if not batch:
                # The first always runs, even when its n alone is over the batch: it must run sometime.
                key = self.pipeline.batch_key(job.request)
            elif images + job.request.n > self.max_batch_images or self.pipeline.batch_key(job.request) != key:
                kept.append(entry)
                continue
            if not job.future.set_running_or_notify_cancel():
                continue
            batch.append(job)
            images += job.request.n
        self._heap = kept
        heapq.heapify(self._heap)
        return batch

    def _generate(self, batch: list[_Job]) -> None:
        started = time.perf_counter()
        callbacks = [job.on_step for job in batch if job.on_step is not None]

        def on_step(step: int, total: int) -> None:
            for callback in callbacks:
                try:
                    callback(step, total)
                except Exception:  # a progress display must not fail the images
                    logger.exception("an on_step callback raised; the request goes on")

        try:
            results = self.pipeline.generate([job.request for job in batch], on_step if callbacks else None)
        except Exception as e:
            if len(batch) > 1:
                # Which request raised is unknown: each runs again alone, so only it fails.
                logger.warning("a batch of %d image requests failed (%r); running them one by one", len(batch), e)
                for job in batch:
                    self._generate([job])
                return
            logger.exception("image request %s failed", batch[0].request.request_id)
            batch[0].future.set_exception(e)
            return
        for job, result in zip(batch, results, strict=True):
            result.timings["queue_s"] = started - job.arrival
            job.future.set_result(result)
