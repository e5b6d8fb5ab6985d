"""Benchmark peers that fail the way real ones have: built by tacit.bench's ProcessPeer in a
child process (so this module must import from the tests folder on sys.path, which spawn passes
on)."""

import os
import signal
import time

from tacit.bench.peers.base import BenchEngine


class SegfaultingBench(BenchEngine):
    """llama-cpp-python's native build on a CPU that advertises AMX: loads, then dies of SIGSEGV
    on its first multi-token batch."""

    name = "segfaulting"

    def __init__(self, path, dtype) -> None:
        pass

    def latency(self, prompts, output_len):
        os.kill(os.getpid(), signal.SIGSEGV)

    def throughput(self, requests):
        os.kill(os.getpid(), signal.SIGSEGV)


class HangingBench(SegfaultingBench):
    """A peer that never answers."""

    name = "hanging"

    def latency(self, prompts, output_len):
        time.sleep(3600)

    throughput = latency
