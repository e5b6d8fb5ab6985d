"""`tacit eval kld`: teacher-forced KL divergence of a model against a reference.

Both models score the same token ids, cut into chunks of --context tokens, each chunk scored
from its own start (no sliding window: every token of a chunk but the first is predicted, from
the chunk's tokens before it). Per predicted token it takes KL(ref || model) =
sum_v p_ref(v) (log p_ref(v) - log p_model(v)) over the whole vocabulary in float32, and each
model's log-probability of the true token (perplexity) and its argmax (top-1 agreement).

The reference is loaded, scored and freed before the model is loaded, so only one model is in
memory at a time; its full distributions are kept (float32, tokens x vocab: 2,048 tokens of
SmolLM2's 49,152-token vocabulary is 400 MB).

--peer llama.cpp (the model a .gguf file; llama-cpp-python, the optional `bench` extra): after
the model, llama.cpp loads the same file and scores the same token ids (tacit's tokenization,
never its own), chunk by chunk from an empty cache, and is compared with the same reference by
the same `compare`, each chunk reduced as it comes (its distributions are not kept). The result
is one row per model (tacit, llama.cpp); the JSON's top level is tacit's, with "peers":
{"llama.cpp": {...}}.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch

from tacit.config.engine_args import EngineArgs
from tacit.eval.kld_plot import add_plot_kld_parser

DEFAULT_MAX_TOKENS = 2048
DEFAULT_CONTEXT = 1024
PEERS = ("llama.cpp",)


def default_text() -> str:
    """Python's own documentation prose (pydoc_data.topics, shipped with every CPython), in
    sorted topic order so the slice is the same on every run of one Python version."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def read_text(path: str | None) -> str:
    if path is None:
        return default_text()
    text = Path(path).read_text(encoding="utf-8")
    if not text.strip():
        raise ValueError(f"--text {path} is empty")
    return text


def chunk_ids(ids: list[int], context: int) -> list[list[int]]:
    """Consecutive chunks of at most context tokens; a last chunk of one token predicts nothing
    and is dropped."""
    if context < 2:
        raise ValueError(f"context must be at least 2 tokens, got {context}")
    chunks = [ids[i : i + context] for i in range(0, len(ids), context)]
    chunks = [c for c in chunks if len(c) >= 2]
    if not chunks:
        raise ValueError(f"the text is {len(ids)} token(s): at least 2 are needed to predict one")
    return chunks


@dataclass
class KLDResult:
    num_tokens: int  # predicted tokens (the first token of each chunk is not predicted)
    num_chunks: int
    context: int
    kld_mean: float
    kld_median: float
    kld_p99: float
    kld_max: float
    ppl_reference: float
    ppl_model: float
    delta_ppl: float  # model - reference
    top1_agreement: float  # fraction of tokens where both argmaxes agree
    # Other engines scored against the same reference on the same ids: {"llama.cpp": result}.
    peers: dict[str, KLDResult] = field(default_factory=dict)
    # The model's matrix-product weights as held (ModelShapes.bits_per_weight): the x of
    # `tacit eval plot-kld`. None for a peer (it scores the same file).
    bits_per_weight: float | None = None


def compare(ref: list[torch.Tensor], model: Iterable[torch.Tensor], chunks: list[list[int]], context: int) -> KLDResult:
    """ref[i], model[i]: [len(chunks[i]) - 1, vocab] float32 log-softmax rows; model may be an
    iterator (each row block is reduced to per-token numbers as it comes, then dropped)."""
    klds, ref_lp, model_lp, agree = [], [], [], []
    for r, m, c in zip(ref, model, chunks):
        if r.shape != m.shape:
            raise ValueError(f"reference and model logprobs differ in shape: {tuple(r.shape)} vs {tuple(m.shape)}")
        target = torch.tensor(c[1:], dtype=torch.long).unsqueeze(1)
        klds.append((r.exp() * (r - m)).sum(-1))
        ref_lp.append(r.gather(1, target).squeeze(1))
        model_lp.append(m.gather(1, target).squeeze(1))
        agree.append(r.argmax(-1) == m.argmax(-1))
    kld = torch.cat(klds).double()
    ppl_ref = math.exp(-torch.cat(ref_lp).double().mean().item())
    ppl_model = math.exp(-torch.cat(model_lp).double().mean().item())
    return KLDResult(
        num_tokens=len(kld),
        num_chunks=len(chunks),
        context=context,
        kld_mean=kld.mean().item(),
        kld_median=kld.median().item(),
        kld_p99=torch.quantile(kld, 0.99).item(),
        kld_max=kld.max().item(),
        ppl_reference=ppl_ref,
        ppl_model=ppl_model,
        delta_ppl=ppl_model - ppl_ref,
        top1_agreement=torch.cat(agree).double().mean().item(),
    )


def _release(llm) -> None:
    """Drop a model before the next one loads (its weights and KV cache)."""
    del llm
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def peer_gguf(peer: str, model: str | None) -> Path:
    """The .gguf file a peer scores: the model's own; anything else is a ValueError (checked
    before any model loads, as is llama-cpp-python being installed)."""
    from tacit.eval.llamacpp_scores import require_llama_cpp
    from tacit.loader.default_model import resolve_default_model

    if peer not in PEERS:
        raise ValueError(f"--peer {peer!r}: known peers are {', '.join(PEERS)}")
    path = resolve_default_model() if model is None else Path(model).expanduser()
    if not (path.is_file() and path.suffix == ".gguf"):
        raise ValueError(
            f"--peer {peer} needs --model to be a .gguf file (llama.cpp scores that same file); {str(path)!r} is not one"
        )
    require_llama_cpp()
    return path


def run_kld(
    model_args: EngineArgs,
    reference_args: EngineArgs,
    text: str,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    context: int = DEFAULT_CONTEXT,
    peer: str | None = None,
) -> KLDResult:
    """The model against the reference; with peer ("llama.cpp"), that engine on the model's GGUF
    too, in result.peers."""
    from tacit.entrypoints.llm import LLM
    from tacit.profiler.roofline import model_shapes

    if max_tokens < 2:
        raise ValueError(f"max_tokens must be at least 2, got {max_tokens}")
    gguf = peer_gguf(peer, model_args.model) if peer is not None else None
    ref_llm = LLM(engine_args=reference_args)
    ids = ref_llm.get_tokenizer().encode(text)[:max_tokens]
    # A chunk is one request: it must fit the engine's context (which may be capped by its KV cache).
    context = min(context, ref_llm.engine.max_model_len)
    chunks = chunk_ids(ids, context)
    ref = ref_llm.score_full_logprobs(chunks)
    _release(ref_llm)
    model_llm = LLM(engine_args=model_args)
    if model_llm.get_tokenizer().encode(text)[:max_tokens] != ids:
        raise ValueError("the model and the reference tokenize the text differently: their KLD is meaningless")
    if context > model_llm.engine.max_model_len:
        raise ValueError(f"the model's max_model_len {model_llm.engine.max_model_len} is below the context {context}")
    model = model_llm.score_full_logprobs(chunks)
    bits = model_shapes(model_llm.engine.model).bits_per_weight
    _release(model_llm)
    result = compare(ref, model, chunks, context)
    result.bits_per_weight = bits
    if gguf is not None:
        from tacit.eval.llamacpp_scores import iter_llamacpp_full_logprobs

        vocab = model[0].shape[-1]
        del model
        threads = len(os.sched_getaffinity(0))
        scores = iter_llamacpp_full_logprobs(gguf, chunks, context, threads, vocab_size=vocab)
        result.peers[peer] = compare(ref, scores, chunks, context)
    return result


def _parse_overrides(spec: str) -> dict[str, str]:
    """'quantization=none,dtype=float32' -> {field: raw string}."""
    out = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--reference-args expects key=value pairs, got {item!r}")
        out[key.strip().replace("-", "_")] = value.strip()
    return out


def reference_engine_args(args: argparse.Namespace) -> EngineArgs:
    """The model's flags, with --reference as the model and --reference-args on top (each value
    converted as its command-line flag would be). Setting quantization there also drops the
    model's --quantization-overrides unless they are set there too."""
    ref = argparse.Namespace(**vars(args))
    ref.model = args.reference if args.reference is not None else args.model
    by_name = {f.name: f for f in fields(EngineArgs)}
    overrides = _parse_overrides(args.reference_args)
    if "quantization" in overrides and "quantization_overrides" not in overrides:
        # A reference given its own quantization (usually none) is the model without the
        # model's per-layer overrides; they would leave it partly quantized.
        ref.quantization_overrides = ""  # the flag's empty form: no overrides, over any recipe's
    for key, raw in overrides.items():
        if key not in by_name:
            raise ValueError(f"--reference-args: unknown engine argument {key!r}")
        convert = by_name[key].metadata["type"]
        setattr(ref, key, convert(raw) if convert else raw)
    return EngineArgs.from_cli_args(ref)


def format_result(r: KLDResult) -> str:
    if r.peers:
        return format_table(r)
    return "\n".join(
        [
            f"tokens            {r.num_tokens} ({r.num_chunks} chunks of <= {r.context})",
            f"KLD mean          {r.kld_mean:.6f}",
            f"KLD median        {r.kld_median:.6f}",
            f"KLD p99           {r.kld_p99:.6f}",
            f"KLD max           {r.kld_max:.6f}",
            f"PPL reference     {r.ppl_reference:.4f}",
            f"PPL model         {r.ppl_model:.4f}",
            f"delta PPL         {r.delta_ppl:+.4f}",
            f"top-1 agreement   {100 * r.top1_agreement:.2f}%",
            *([f"bits per weight   {r.bits_per_weight:.2f}"] if r.bits_per_weight is not None else []),
        ]
    )


def format_table(r: KLDResult) -> str:
    """One row per model (tacit, then the peers), against the one reference."""
    rows = [("tacit", r), *r.peers.items()]
    width = max(len(name) for name, _ in rows)
    lines = [
        f"tokens {r.num_tokens} ({r.num_chunks} chunks of <= {r.context}), PPL reference {r.ppl_reference:.4f}",
        f"{'model':<{width}}  {'KLD mean':>9}  {'median':>9}  {'p99':>9}  {'max':>9}  {'PPL':>9}  "
        f"{'delta PPL':>9}  {'top-1':>7}",
    ]
    for name, x in rows:
        lines.append(
            f"{name:<{width}}  {x.kld_mean:9.6f}  {x.kld_median:9.6f}  {x.kld_p99:9.6f}  {x.kld_max:9.6f}  "
            f"{x.ppl_model:9.4f}  {x.delta_ppl:+9.4f}  {100 * x.top1_agreement:6.2f}%"
        )
    return "\n".join(lines)


def result_json(r: KLDResult) -> dict:
    """tacit's numbers at the top level, each peer's under "peers" (without a "peers" of its own)."""
    out = asdict(r)
    for peer in out["peers"].values():
        del peer["peers"], peer["bits_per_weight"]
    return out


def cmd_kld(args: argparse.Namespace) -> int:
    text = read_text(args.text)
    model_args, reference_args = EngineArgs.from_cli_args(args), reference_engine_args(args)
    result = run_kld(model_args, reference_args, text, args.max_tokens, args.context, args.peer)
    print(format_result(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result_json(result), indent=2) + "\n")
        print(f"tacit: wrote {args.json}", file=sys.stderr)
    return 0


def add_eval_parser(sub: argparse._SubParsersAction) -> None:
    e = sub.add_parser("eval", help="accuracy of a model against a reference")
    esub = e.add_subparsers(dest="eval", required=True)
    k = esub.add_parser("kld", help="teacher-forced KL divergence and perplexity against a reference model")
    EngineArgs.add_cli_args(k)  # --model and the engine flags: the model under test
    k.add_argument("--reference", default=None, help="the reference model (default: --model, with --reference-args)")
    k.add_argument(
        "--reference-args",
        default="",
        help="engine flags for the reference only, key=value,... (e.g. quantization=none,dtype=float32)",
    )
    k.add_argument("--text", default=None, help="UTF-8 text file (default: Python's pydoc_data documentation prose)")
    k.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, help="tokens of the text to use")
    k.add_argument(
        "--context", type=int, default=DEFAULT_CONTEXT, help="chunk length; each chunk scored from its start"
    )
    k.add_argument(
        "--peer",
        choices=PEERS,
        default=None,
        help="also score the same token ids with llama.cpp on the --model .gguf file, against the same reference "
        "(needs llama-cpp-python: pip install -e '.[bench]')",
    )
    k.add_argument("--json", default=None, help="write the numbers as JSON here")
    k.set_defaults(func=cmd_kld)
    add_plot_kld_parser(esub)
