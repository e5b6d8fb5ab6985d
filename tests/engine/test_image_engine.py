"""ImageEngine's queue, batching and isolation, over a stand-in pipeline that records the batches
it is given (the real pipeline's output is tested against diffusers in tests/diffusion): lower
priority first then arrival; a batch takes the queued requests sharing the first one's batch_key
while its images fit; a request that raises fails alone; bad requests are refused at submit."""

from __future__ import annotations

import concurrent.futures
import threading

import pytest

pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

from tacit.diffusion.request import ImageLimits, ImageRequest, ImageResult  # noqa: E402
from tacit.engine.image_engine import ImageEngine  # noqa: E402
from tacit.engine.request_stream import EngineDeadError, QueueFullError  # noqa: E402

TIMEOUT = 10


class RecordingPipeline:
    """batch_key as the real pipeline's (what one UNet call must share); generate records each
    batch's prompts, fails the whole batch when a prompt is "boom", and can be held at a gate."""

    def __init__(self) -> None:
        self.limits = ImageLimits(min_size=64, max_size=256, size_multiple=8, max_steps=50, max_n=4)
        self.model_name = "recording"
        self.batches: list[list[str]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def batch_key(self, req: ImageRequest) -> tuple:
        return (req.width, req.height, req.steps, req.scheduler, req.uses_cfg)

    def generate(self, requests: list[ImageRequest], on_step=None) -> list[ImageResult]:
        self.entered.set()
        assert self.gate.wait(TIMEOUT)
        self.batches.append([r.prompt for r in requests])
        if any(r.prompt == "boom" for r in requests):
            raise RuntimeError("boom")
        for step in range(requests[0].steps):
            if on_step is not None:
                on_step(step + 1, requests[0].steps)
        return [
            ImageResult(r.request_id, [Image.new("RGB", (r.width, r.height))] * r.n, r.seed or 0, {"denoise_s": 0.0})
            for r in requests
        ]


def req(prompt: str, priority: int = 0, width: int = 64, n: int = 1, steps: int = 2) -> ImageRequest:
    return ImageRequest(prompt=prompt, width=width, height=64, n=n, steps=steps, priority=priority)


@pytest.fixture
def held():
    """An engine whose first batch ("blocker") is held at the gate, so what is queued behind it
    is all waiting when the worker next takes a batch."""
    pipeline = RecordingPipeline()
    engine = ImageEngine(pipeline, max_batch_images=4)
    engine.start()
    pipeline.gate.clear()
    first = engine.submit(req("blocker"))
    assert pipeline.entered.wait(TIMEOUT)
    yield engine, pipeline, first
    pipeline.gate.set()
    engine.shutdown()


def wait_all(futures) -> None:
    concurrent.futures.wait(futures, timeout=TIMEOUT)


def test_lower_priority_runs_first_then_arrival_one_image_at_a_time():
    pipeline = RecordingPipeline()
    engine = ImageEngine(pipeline, max_batch_images=1)
    engine.start()
    pipeline.gate.clear()
    futures = [engine.submit(req("blocker"))]
    assert pipeline.entered.wait(TIMEOUT)
    for prompt, priority in [("a5", 5), ("b1", 1), ("c5", 5), ("d1", 1), ("e-2", -2)]:
        futures.append(engine.submit(req(prompt, priority)))
    pipeline.gate.set()
    wait_all(futures)
    engine.shutdown()
    assert pipeline.batches == [["blocker"], ["e-2"], ["b1"], ["d1"], ["a5"], ["c5"]]
    assert all(f.result().images[0].size == (64, 64) for f in futures)


def test_a_batch_takes_the_queued_requests_sharing_the_first_ones_key(held):
    engine, pipeline, first = held
    futures = [
        engine.submit(req("a", priority=5)),
        engine.submit(req("b-wide", priority=1, width=128)),  # another size: another UNet batch
        engine.submit(req("c", priority=3)),
        engine.submit(req("d", priority=1)),
        engine.submit(req("e-10steps", priority=0, steps=10)),  # another step count
    ]
    pipeline.gate.set()
    wait_all([first, *futures])
    # b-wide first (priority 1, earlier than d); then d with the 64x64 2-step requests behind it,
    # in queue order, a lower priority riding along; e-10steps (priority 0!) ran ahead of all.
    assert pipeline.batches == [["blocker"], ["e-10steps"], ["b-wide"], ["d", "c", "a"]]
    assert [f.result().request_id != "" for f in futures] == [True] * 5


def test_a_batch_holds_at_most_max_batch_images_but_a_wide_request_still_runs(held):
    engine, pipeline, first = held
    futures = [engine.submit(req(p, n=n)) for p, n in [("three", 3), ("two", 2), ("one", 1), ("four", 4)]]
    pipeline.gate.set()
    wait_all([first, *futures])
    assert pipeline.batches == [["blocker"], ["three", "one"], ["two"], ["four"]]
    assert [len(f.result().images) for f in futures] == [3, 2, 1, 4]


def test_a_failing_request_fails_alone_and_the_engine_goes_on(held):
    engine, pipeline, first = held
    good1, bad, good2 = (engine.submit(req(p)) for p in ("good1", "boom", "good2"))
    pipeline.gate.set()
    wait_all([first, good1, bad, good2])
    with pytest.raises(RuntimeError, match="boom"):
        bad.result()
    assert good1.result().images and good2.result().images
    # The batch failed, then each ran alone: only "boom" raised.
    assert pipeline.batches[1:] == [["good1", "boom", "good2"], ["good1"], ["boom"], ["good2"]]
    assert engine.submit(req("after")).result(TIMEOUT).images
    assert engine.is_running


def test_bad_requests_are_refused_before_they_queue(held):
    engine, pipeline, _ = held
    with pytest.raises(ValueError, match=r"width=100: must be a multiple of 8 between 64 and 256"):
        engine.submit(req("x", width=100))
    with pytest.raises(ValueError, match=r"steps=51: must be an integer between 1 and 50"):
        engine.submit(req("x", steps=51))
    assert engine.num_waiting == 0


def test_a_request_cancelled_while_queued_never_runs(held):
    engine, pipeline, first = held
    gone, kept = engine.submit(req("gone")), engine.submit(req("kept"))
    assert gone.cancel()
    pipeline.gate.set()
    wait_all([first, kept])
    assert kept.result().images
    assert pipeline.batches == [["blocker"], ["kept"]]


def test_progress_per_step_reaches_every_request_of_the_batch(held):
    engine, pipeline, first = held
    seen: dict[str, list[tuple[int, int]]] = {"a": [], "b": []}
    futures = [engine.submit(req(p, steps=3), on_step=lambda s, t, p=p: seen[p].append((s, t))) for p in seen]
    pipeline.gate.set()
    wait_all([first, *futures])
    assert pipeline.batches[1] == ["a", "b"]
    assert seen == {"a": [(1, 3), (2, 3), (3, 3)], "b": [(1, 3), (2, 3), (3, 3)]}


def test_a_full_queue_and_a_stopped_engine_refuse_and_waiting_requests_fail():
    pipeline = RecordingPipeline()
    engine = ImageEngine(pipeline, max_waiting=2)
    engine.start()
    pipeline.gate.clear()
    first = engine.submit(req("blocker"))
    assert pipeline.entered.wait(TIMEOUT)
    waiting = [engine.submit(req("w1")), engine.submit(req("w2"))]
    with pytest.raises(QueueFullError):
        engine.submit(req("w3"))
    stopper = threading.Thread(target=engine.shutdown)
    stopper.start()
    while engine.is_running:  # shutdown has been asked before the batch in progress ends
        threading.Event().wait(0.01)
    pipeline.gate.set()
    stopper.join(TIMEOUT)
    assert first.result(TIMEOUT).images  # the batch in progress ends normally
    for f in waiting:
        with pytest.raises(EngineDeadError):
            f.result(TIMEOUT)
    with pytest.raises(EngineDeadError):
        engine.submit(req("late"))
