"""`tacit generate | chat | serve | fetch | models | image | build-kernels`: the entrypoints' commands (the `tacit` parser itself: tacit/cli.py)."""

from __future__ import annotations

import argparse
import os
import sys
import time

from tacit.config.engine_args import EngineArgs
from tacit.config.sizes import parse_bytes
from tacit.entrypoints.adaptive_args import add_adaptive_args
from tacit.entrypoints.image_cli import add_image_parser, add_image_serve_args
from tacit.entrypoints.list_models import add_models_parser
from tacit.entrypoints.openai.access_log import ACCESS_LOG_FORMATS
from tacit.entrypoints.openai.harmony import REASONING_PARSERS
from tacit.entrypoints.openai.limits import DEFAULT_MAX_REQUEST_BYTES
from tacit.entrypoints.openai.tool_parser import TOOL_CALL_PARSERS
from tacit.loader.hf_cache import display_name


def load_llm(args: argparse.Namespace):
    from tacit.entrypoints.llm import LLM

    t0 = time.perf_counter()
    engine_args = EngineArgs.from_cli_args(args)
    print(
        f"tacit: loading {engine_args.model or 'the default model (SmolLM2-135M-Instruct)'} ...",
        file=sys.stderr,
        flush=True,
    )
    llm = LLM(engine_args=engine_args)
    print(
        f"tacit: loaded {display_name(engine_args.model, llm.engine.source.path)} in {time.perf_counter() - t0:.1f}s "
        f"({llm.engine.config.model.dtype}, {llm.engine.num_kv_blocks} KV blocks, "
        f"max_model_len {llm.engine.max_model_len})",
        file=sys.stderr,
        flush=True,
    )
    return llm


def cmd_generate(args: argparse.Namespace) -> int:
    from tacit.sampling_params import SamplingParams

    llm = load_llm(args)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed_sample)
    for piece in llm.stream(args.prompt, params):
        print(piece, end="", flush=True)
    print()
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from tacit.entrypoints.chat_session import ChatSession
    from tacit.sampling_params import SamplingParams

    llm = load_llm(args)
    params = SamplingParams(
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, max_tokens=args.max_tokens
    )
    context = max(1, llm.engine.max_model_len - args.max_tokens)
    session = ChatSession(llm.chat_prompt_ids, context, args.system)
    interactive = sys.stdin.isatty()
    if interactive:
        try:
            import readline  # noqa: F401  line editing and history for input()
        except ImportError:
            pass
        print("tacit: /help lists the commands; Ctrl-C stops a reply, Ctrl-D ends the session", file=sys.stderr)
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
        try:
            said = session.command(line)
        except SystemExit:
            return 0
        if said is not None:
            print(said, flush=True)
            continue
        try:
            ids, dropped = session.prompt(line)
        except ValueError as e:
            print(f"tacit: {e}", file=sys.stderr, flush=True)
            continue
        if dropped:
            print(
                f"(the {dropped} earliest turn(s) dropped to fit the context: {context} prompt tokens)",
                file=sys.stderr,
                flush=True,
            )
        session.answered(_stream_reply(llm, ids, params))


def _stream_reply(llm, ids: list[int], params) -> str:
    """Print the reply as it comes; Ctrl-C stops it after the current step (the engine is never
    interrupted mid-step) and the session goes on with what was printed."""
    import signal

    stop = []
    previous = signal.signal(signal.SIGINT, lambda *_: stop.append(True))
    reply = []
    stream = llm.stream(ids, params)
    try:
        for piece in stream:
            reply.append(piece)
            print(piece, end="", flush=True)
            if stop:
                print(" [stopped]", end="")
                break
    finally:
        stream.close()  # aborts the request if it was stopped
        signal.signal(signal.SIGINT, previous)
    print(flush=True)
    return "".join(reply)


def cmd_fetch(args: argparse.Namespace) -> int:
    from tacit.loader.default_model import fetch_default_model

    print(fetch_default_model())
    return 0


def cmd_build_kernels(args: argparse.Namespace) -> int:
    """Compile the C++ kernels now (setup runs this), so the first `tacit chat` does not: 0 when
    each one this host can use is built, 1 when a build failed (tacit then runs the torch path)."""
    from tacit.distributed.shm_kernels import load_shm_kernels
    from tacit.kernels.cpu_kernels import cpu_kernels_default, cpu_supports_avx512_bf16, load_cpu_kernels

    failed = 0
    for what, supported, load in [
        (
            "AVX512-BF16 CPU kernels",
            cpu_supports_avx512_bf16() and cpu_kernels_default(),
            load_cpu_kernels,
        ),
        (
            "shared-memory communicator",
            sys.platform.startswith("linux") and not os.environ.get("TACIT_NO_SHM_COMM"),
            load_shm_kernels,
        ),
    ]:
        if not supported:
            print(f"{what}: not for this host (or turned off), nothing to build")
            continue
        module = load()
        failed += module is None
        print(f"{what}: {module.__file__ if module is not None else 'build failed (see above)'}")
    return 1 if failed else 0


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from tacit.entrypoints.openai.api_server import run_server
    except ImportError as e:  # fastapi/uvicorn are an extra, not a core dependency
        if (e.name or "").split(".")[0] not in ("fastapi", "uvicorn", "starlette", "pydantic"):
            raise
        raise ValueError(f"`tacit serve` needs fastapi and uvicorn: pip install 'tacit[serve]' ({e})") from None

    return run_server(args)


def _tool_call_parser(name: str) -> str:
    if name not in TOOL_CALL_PARSERS:
        raise argparse.ArgumentTypeError(
            f"{name!r} is not a tool-call parser tacit has; valid: {', '.join(TOOL_CALL_PARSERS)} "
            f"(hermes: <tool_call> JSON </tool_call>; openai: gpt-oss's harmony format): a model that writes calls "
            f"another way is not supported yet"
        )
    return name


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """generate, chat, serve, fetch, models, image and build-kernels, as subcommands of the `tacit` parser."""
    g = sub.add_parser("generate", help="complete one prompt, streaming the text")
    EngineArgs.add_cli_args(g)
    g.add_argument("--prompt", required=True)
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--seed-sample", type=int, default=None, help="seed of the sampler for this request")
    g.set_defaults(func=cmd_generate)

    c = sub.add_parser(
        "chat",
        help="chat with the model's chat template (/help: the session's commands); reads one turn per line when piped",
    )
    EngineArgs.add_cli_args(c)
    c.add_argument("--max-tokens", type=int, default=256)
    c.add_argument("--temperature", type=float, default=0.0)
    c.add_argument("--top-p", type=float, default=1.0)
    c.add_argument("--top-k", type=int, default=-1, help="-1: every token")
    c.add_argument("--system", default=None, help="system prompt (/system TEXT changes it in the session)")
    c.set_defaults(func=cmd_chat)

    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server")
    EngineArgs.add_cli_args(s)
    # The server's own flags, one argument group (vLLM's title): `tacit serve --help=frontend`.
    front = s.add_argument_group("frontend", "the HTTP server: tacit serve's own flags")
    front.add_argument("--host", default="127.0.0.1")
    front.add_argument("--port", type=int, default=8000)
    front.add_argument(
        "--api-key",
        default=os.environ.get("TACIT_API_KEY"),
        help="require this bearer key on /v1 and /tokenize (default: $TACIT_API_KEY, which keeps the key out of "
        "the process list)",
    )
    front.add_argument("--max-waiting", type=int, default=256)
    front.add_argument(
        "--max-request-bytes",
        type=parse_bytes,
        metavar="SIZE",
        default=DEFAULT_MAX_REQUEST_BYTES,
        help="largest request body accepted; a larger one gets 413 before it is read (default 16 MiB)",
    )
    front.add_argument(
        "--served-model-name",
        default=None,
        metavar="NAME",
        help="the model name requests give and responses carry (default: --model as given)",
    )
    front.add_argument(
        "--tool-call-parser",
        type=_tool_call_parser,
        default=None,
        help=f"how tool calls are read out of generated text, vLLM's names: {' | '.join(TOOL_CALL_PARSERS)} "
        f"(hermes: <tool_call> JSON </tool_call>, the format tacit's tools prompt and Qwen2.5/Qwen3 templates ask "
        f"for; openai: gpt-oss's harmony format); default: openai for a gpt-oss model, hermes otherwise",
    )
    front.add_argument(
        "--reasoning-parser",
        choices=REASONING_PARSERS,
        default=None,
        help="how reasoning is split from the answer into reasoning_content, vLLM's names: openai_gptoss (the "
        "harmony format's analysis channel; a gpt-oss model gets it without the flag)",
    )
    front.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help="vLLM's switch for tool_choice auto, which tacit always serves: a request that sends tools may get "
        "calls back",
    )
    front.add_argument(
        "--shutdown-timeout",
        type=float,
        default=20.0,
        help="seconds in-flight requests get to finish after SIGTERM before they are aborted",
    )
    front.add_argument(
        "--enable-log-requests",
        action="store_true",
        help="log one line per request when it ends (logger tacit.access): request id, route, status, "
        "prompt and completion tokens, TTFT and total time; errors too, with their status",
    )
    front.add_argument(
        "--log-format",
        choices=ACCESS_LOG_FORMATS,
        default=ACCESS_LOG_FORMATS[0],
        help="how --enable-log-requests writes a line: text (key=value) or json (one JSON object a line) "
        "(default text)",
    )
    front.add_argument(
        "--enable-tokenizer-info-endpoint",
        action="store_true",
        help="serve GET /tokenizer_info (vLLM's: the tokenizer's config, special tokens and chat template, "
        "which lm-evaluation-harness's remote tokenizer reads); without it the route is 404",
    )
    add_adaptive_args(front)
    add_image_serve_args(s)
    s.set_defaults(func=cmd_serve)

    f = sub.add_parser("fetch", help="fetch the embedded default model into the cache")
    f.set_defaults(func=cmd_fetch)

    add_models_parser(sub)
    add_image_parser(sub)

    b = sub.add_parser("build-kernels", help="compile the C++ kernels now, not on first use (setup runs it)")
    b.set_defaults(func=cmd_build_kernels)
