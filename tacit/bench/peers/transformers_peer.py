"""transformers as a peer: `generate` with static batches, and `generate_batch`-style continuous batching."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from tacit.bench.peers.base import BenchEngine, throughput_result


def load_hf_model(path: Path, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    if path.is_file():
        # A GGUF becomes a plain HF directory of the dequantized weights tacit runs: loaded as
        # GGUF, transformers would keep Q4_1 blocks packed and time a different computation.
        from tacit.loader.hf_writer import gguf_to_hf_dir
        from tacit.paths import cache_dir

        hf_dir = cache_dir() / f"{path.stem}.{str(dtype).removeprefix('torch.')}.hf"
        if not (hf_dir / "model.safetensors").exists():
            gguf_to_hf_dir(path, hf_dir, dtype)
        path = hf_dir
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()


class _FirstTokenClock:
    """A generate() streamer: put() gets the prompt first, then each step's tokens."""

    def __init__(self) -> None:
        self.calls, self.first = 0, None

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2:
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


class TransformersBench(BenchEngine):
    name = "transformers"

    def __init__(self, path: Path, dtype: torch.dtype, static_batch: int = 16) -> None:
        self.model = load_hf_model(path, dtype)
        self.static_batch = static_batch

    @torch.inference_mode()
    def _generate(self, prompts: list[list[int]], new_tokens: int, streamer=None) -> None:
        width = max(len(p) for p in prompts)
        ids = torch.zeros(len(prompts), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):  # left padding, as batched generation needs
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        self.model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
            streamer=streamer,
        )

    def latency(self, prompts: list[list[int]], output_len: int) -> dict[str, float]:
        clock = _FirstTokenClock()
        t0 = time.perf_counter()
        self._generate(prompts, output_len, streamer=clock)
        total = time.perf_counter() - t0
        ttft = clock.first - t0
        return {"ttft_s": ttft, "decode_tok_s": len(prompts) * (output_len - 1) / (total - ttft)}

    def throughput(self, requests: list[tuple[list[int], int]]) -> dict[str, float]:
        # Static batching: a batch runs until its longest request is done; only requested tokens count.
        t0 = time.perf_counter()
        for i in range(0, len(requests), self.static_batch):
            chunk = requests[i : i + self.static_batch]
            self._generate([p for p, _ in chunk], max(n for _, n in chunk))
        return throughput_result(time.perf_counter() - t0, requests)


class TransformersContinuousBench(TransformersBench):
    """transformers' own continuous batching (the manager behind `generate_batch`)."""

    name = "transformers-cb"

    def latency(self, prompts, output_len):
        return None

    @torch.inference_mode()
    def throughput(self, requests: list[tuple[list[int], int]]) -> dict[str, float]:
        from transformers import GenerationConfig

        cfg = GenerationConfig(
            do_sample=False, max_new_tokens=max(n for _, n in requests), eos_token_id=-1, pad_token_id=0
        )
        t0 = time.perf_counter()
        with self.model.continuous_batching_context_manager(generation_config=cfg, block=True, timeout=5) as manager:
            for i, (p, n) in enumerate(requests):
                manager.add_request(p, request_id=f"r{i}", max_new_tokens=n, eos_token_id=-1)
            done = 0
            while done < len(requests):
                result = manager.get_result(timeout=1)
                if result is not None and result.is_finished():
                    done += 1
                elif result is None and not manager.is_running():
                    raise RuntimeError("transformers' continuous batching thread stopped early")
        return throughput_result(time.perf_counter() - t0, requests)
