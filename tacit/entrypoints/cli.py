"""`tacit ...`: generate, chat, serve, fetch."""

from __future__ import annotations

import argparse
import sys
import time


def add_engine_args(p: argparse.ArgumentParser) -> None:
    # Defaults are None, meaning "not given": a --recipe fills those, LLMEngine's defaults the rest.
    p.add_argument("--recipe", default=None, metavar="PATH",
                   help="recipe YAML (or its folder, e.g. recipes/smollm2-135m-cpu); flags given here override it")
    p.add_argument("--model", default=None, help="HF model directory or .gguf file (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", default=None, help="auto | float32 | bfloat16 | float16 (default auto)")
    p.add_argument("--device", default=None, help="auto | cpu | cuda (default auto)")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=None, help="default 64")
    p.add_argument("--max-num-batched-tokens", type=int, default=None, help="default 2048")
    p.add_argument("--block-size", type=int, default=None, help="default 16")
    p.add_argument("--num-kv-blocks", type=int, default=None)
    p.add_argument("--kv-cache-memory", type=int, default=None, help="bytes for the KV pool")
    p.add_argument("--no-chunked-prefill", action="store_true", default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--scheduling-policy", default=None, help="fcfs | priority | sjf | sla (default fcfs)")
    p.add_argument("--long-prefill-token-threshold", type=int, default=None,
                   help="most prompt tokens one request prefills per step (0: no cap; default 512)")
    p.add_argument("--max-long-partial-prefills", type=int, default=None,
                   help="how many prompts longer than the threshold prefill in one step (default 1)")
    p.add_argument("--aging-s", type=float, default=None,
                   help="seconds after which a waiting request goes ahead of all newer ones (0: never; default 60)")
    p.add_argument("--slo-class", action="append", default=None, metavar="PRIORITY:ttft=MS,tpot=MS",
                   help="default TTFT/TPOT targets for a priority class (repeatable), e.g. 0:ttft=500,tpot=100")
    p.add_argument("--slo-admission", default=None, help="reject | defer: what sla does with a request "
                   "whose estimated TTFT misses its target (default reject)")
    p.add_argument("--preemption-mode", default=None, help="auto | recompute | swap (default auto)")
    p.add_argument("--cut-in-prefill-tokens", type=int, default=None,
                   help="a waiting request that outranks someone in the step in flight and has at most this many "
                        "prompt tokens is prefilled between that step's layers (tacit serve; 0: never; default 256)")
    p.add_argument("--swap-space", type=float, default=None,
                   help="GiB of host memory for swapped-out KV blocks (default 4)")


def engine_kwargs(args: argparse.Namespace) -> dict:
    """LLMEngine's keywords: the flags given, over the recipe's settings, over the engine's defaults."""
    from tacit.config import parse_slo_class
    from tacit.recipe import merge_engine_args

    given = dict(model=args.model, dtype=args.dtype, device=args.device, max_model_len=args.max_model_len,
                 max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                 block_size=args.block_size, num_kv_blocks=args.num_kv_blocks, kv_cache_memory=args.kv_cache_memory,
                 seed=args.seed, scheduling_policy=args.scheduling_policy,
                 long_prefill_token_threshold=args.long_prefill_token_threshold,
                 max_long_partial_prefills=args.max_long_partial_prefills, slo_admission=args.slo_admission,
                 preemption_mode=args.preemption_mode, swap_space=args.swap_space,
                 cut_in_prefill_tokens=args.cut_in_prefill_tokens)
    given = {k: v for k, v in given.items() if v is not None}
    if args.no_chunked_prefill:
        given["enable_chunked_prefill"] = False
    if args.aging_s is not None:
        given["aging_s"] = args.aging_s or None
    if args.slo_class:
        given["slo_classes"] = dict(parse_slo_class(s) for s in args.slo_class)
    return merge_engine_args(args.recipe, given)


def load_llm(args: argparse.Namespace):
    from tacit import LLM

    t0 = time.perf_counter()
    kwargs = engine_kwargs(args)
    print(f"tacit: loading {kwargs.get('model') or 'the default model (SmolLM2-135M-Instruct)'} ...", file=sys.stderr,
          flush=True)
    llm = LLM(**kwargs)
    print(f"tacit: loaded {llm.engine.source.path.name} in {time.perf_counter() - t0:.1f}s "
          f"({llm.engine.config.model.dtype}, {llm.engine.num_kv_blocks} KV blocks)", file=sys.stderr, flush=True)
    return llm


def cmd_generate(args: argparse.Namespace) -> int:
    from tacit import SamplingParams

    llm = load_llm(args)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed_sample)
    for piece in llm.stream(args.prompt, params):
        print(piece, end="", flush=True)
    print()
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from tacit import SamplingParams

    llm = load_llm(args)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens)
    history: list[dict] = []
    if args.system:
        history.append({"role": "system", "content": args.system})
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            try:
                line = input("> ")
            except (EOFError, KeyboardInterrupt):
                print()
                return 0
        else:
            line = sys.stdin.readline()
            if not line:
                return 0
        line = line.strip()
        if not line:
            continue
        history.append({"role": "user", "content": line})
        reply = []
        for piece in llm.stream(llm.chat_prompt_ids(history), params):
            reply.append(piece)
            print(piece, end="", flush=True)
        print(flush=True)
        history.append({"role": "assistant", "content": "".join(reply)})


def cmd_fetch(args: argparse.Namespace) -> int:
    from tacit.loader.default_model import fetch_default_model

    print(fetch_default_model())
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from tacit.entrypoints.openai.api_server import run_server
    except ImportError as e:  # fastapi/uvicorn are an extra, not a core dependency
        if (e.name or "").split(".")[0] not in ("fastapi", "uvicorn", "starlette", "pydantic"):
            raise
        raise ValueError(f"`tacit serve` needs fastapi and uvicorn: pip install 'tacit[serve]' ({e})") from None

    return run_server(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tacit", description="tacit: an LLM inference engine")
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="complete one prompt, streaming the text")
    add_engine_args(g)
    g.add_argument("--prompt", required=True)
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--seed-sample", type=int, default=None, help="seed of the sampler for this request")
    g.set_defaults(func=cmd_generate)

    c = sub.add_parser("chat", help="chat with the model's chat template; reads one turn per line when piped")
    add_engine_args(c)
    c.add_argument("--max-tokens", type=int, default=256)
    c.add_argument("--temperature", type=float, default=0.0)
    c.add_argument("--system", default=None, help="system prompt")
    c.set_defaults(func=cmd_chat)

    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server")
    add_engine_args(s)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--api-key", default=None)
    s.add_argument("--max-waiting", type=int, default=256)
    s.add_argument("--served-model-name", default=None)
    s.add_argument("--shutdown-timeout", type=float, default=20.0,
                   help="seconds in-flight requests get to finish after SIGTERM before they are aborted")
    s.set_defaults(func=cmd_serve)

    from tacit.bench.cli import add_bench_parser

    add_bench_parser(sub)

    f = sub.add_parser("fetch", help="fetch the embedded default model into the cache")
    f.set_defaults(func=cmd_fetch)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (FileNotFoundError, ValueError) as e:
        print(f"tacit: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
