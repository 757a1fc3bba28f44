"""`ssr bench`, `ssr report`, `ssr calibrate`, `ssr simulate`: command bodies (the
parser lives in cli.py)."""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from ..config import MODE_TABLE, MODES, ConfigError, GenerationConfig
from ..engines import ENGINES, load_engine
from .report import (attach_quality, drafting_table, format_drafting, format_table, group_name, load_rows,
                     render_table, summarise, write_report)
from .requests import format_requests, requests_table


def make_scorer(data_dir: Path | None):
    """scorer(suite, item_id, answer) -> Score dict; suites are loaded on first use."""
    from .scoring import score
    from .suites import load_suite

    references: dict[str, dict[str, dict]] = {}

    def scorer(suite: str, item_id: str, answer: str) -> dict:
        if suite not in references:
            references[suite] = {item.item_id: item.reference for item in load_suite(suite, data_dir)}
        reference = references[suite].get(item_id)
        if reference is None:
            return {"value": 0.0, "passed": False, "detail": {}, "note": "item not in the data folder"}
        return score(suite, reference, answer).as_dict()

    return scorer


def build_report(rows: list[dict], out_dir: Path, data_dir: Path | None, note: str = "") -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    attach_quality(rows, make_scorer(data_dir), out_dir / "quality.json")
    return write_report(rows, out_dir, note)


def _modes(text: str, flag: str) -> list[str]:
    """A comma-separated list of known modes, or a clear error naming the flag."""
    modes = [m.strip() for m in text.split(",") if m.strip()]
    replayed = [m for m in modes if m in MODE_TABLE and MODE_TABLE[m].replays_as]
    if replayed:
        raise ConfigError(f"{flag}: {', '.join(replayed)} replay only, on traces (ssr traces --modes); the engines "
                          f"run {', '.join(MODES)}")
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise ConfigError(f"{flag}: unknown {', '.join(unknown) or 'empty list'}; choose from {', '.join(MODES)}")
    return modes


def cmd_bench(args: argparse.Namespace, config: GenerationConfig, model_loader) -> int:
    from .runner import run_bench
    from .suites import load_suite

    modes = _modes(args.modes, "--modes")
    if args.limit < 1 or args.repeats < 1:
        raise ConfigError("--limit and --repeats must be >= 1")
    for mode in modes:
        replace(config, mode=mode)  # validates each mode's budgets
    engines = list(dict.fromkeys(e.strip() for e in args.engine.split(",") if e.strip()))
    if not engines or any(e not in ENGINES for e in engines):
        raise ConfigError(f"--engine: give engines from {', '.join(ENGINES)}, comma-separated; got {args.engine!r}")
    data_dir = Path(args.data_dir) if args.data_dir else None  # flags checked first, then files read
    items = [item for suite in (args.suites or ["classeval"]) for item in load_suite(suite, data_dir, args.limit)]
    def engine_args(engine: str) -> argparse.Namespace:  # --device is the transformers engine's, --dtype
        own = {} if engine == "transformers" else {"device": None} if engine == "vllm" else \
            {"device": None, "dtype": None}  # also vLLM's
        if engine != "vllm":  # and the vLLM flags vLLM's
            from ..flags import VLLM_DEFAULTS

            own.update(VLLM_DEFAULTS)
        if engine != "llama.cpp":  # and --n-gpu-layers llama.cpp's
            own["n_gpu_layers"] = None
        return argparse.Namespace(**{**vars(args), "engine": engine, **own})

    models = {engine: model_loader(engine_args(engine)) for engine in engines}
    out_dir = Path(args.out)
    out = out_dir / "runs.jsonl"
    rows: list[dict] = []
    try:
        rows = run_bench(models, items, modes, config, args.repeats, out)
    finally:
        for model in models.values():  # vLLM: shut its engine process down before the interpreter exits
            close = getattr(model.engine, "close", None)
            if close is not None:
                close()
        if not rows and out.exists():  # interrupted: report what was written
            rows = load_rows([out])
        if rows:
            note = (f"Model `{args.model}` on {', '.join(engines)}; {len({(r['suite'], r['item']) for r in rows})} items; "
                    f"config: policy {config.policy}, b_v={config.thinking_budget or 'the format’s'}, "
                    f"b_d={config.draft_at}, m={config.draft_tokens}, i={config.draft_interval}, "
                    f"max tokens={config.max_tokens or 'the context'}, max answer tokens="
                    f"{config.max_answer_tokens or 'no cap'}, temperature={config.sampling.temperature}.")
            report = build_report(rows, out_dir, data_dir, note) if not args.no_quality else None
            print(format_table(summarise(rows)))
            drafting = drafting_table(rows)
            if drafting:
                print(format_drafting(drafting))
            requests = requests_table(rows, group_name)
            if requests:
                print(format_requests(requests, render_table))
            print(f"rows: {out}" + (f"\nreport: {report}" if report else ""), file=sys.stderr)
    return 0


def _rows_at(paths: list[Path]) -> list[dict]:
    """Bench rows from folders (runs.jsonl) or JSONL files; a clear error when there are none."""
    missing = [str(p) for p in paths if not (p / "runs.jsonl" if p.is_dir() else p).is_file()]
    if missing:
        raise ConfigError(f"no bench rows at {', '.join(missing)} (give folders with runs.jsonl or JSONL files)")
    rows = load_rows(paths)
    if not rows:
        raise ConfigError("the bench files hold no rows")
    return rows


def cmd_report(args: argparse.Namespace) -> int:
    paths = [Path(p) for p in args.results]
    rows = _rows_at(paths)
    out_dir = Path(args.out) if args.out else (paths[0] if paths[0].is_dir() else paths[0].parent)
    data_dir = Path(args.data_dir) if args.data_dir else None
    report = build_report(rows, out_dir, data_dir, args.note or "")
    print(format_table(summarise(rows)))
    print(f"report: {report}", file=sys.stderr)
    return 0


def cmd_calibrate(args: argparse.Namespace, model_loader) -> int:
    from tqdm import tqdm

    from ..pricing.costs import SCORE_SIZES, STEP_SIZES
    from ..pricing.probe import calibrate

    if args.repeats < 1:
        raise ConfigError(f"--timings must be >= 1, got {args.repeats}")
    if not 8 <= args.context_tokens <= (args.context_size - 600) // 2:
        raise ConfigError(f"--context-tokens must be in 8..{(args.context_size - 600) // 2} (half of --context-size "
                          f"less room for the probes: it is probed at twice the length too), got {args.context_tokens}")
    model = model_loader(args)
    if args.engine == "vllm":  # vLLM schedules its own batches: timed through its requests
        from ..engines import vllm_costs

        with tqdm(total=len(vllm_costs.STEP_SEQUENCES) + len(vllm_costs.SCORE_TOKENS), unit="probe",
                  disable=not sys.stderr.isatty()) as bar:
            costs = vllm_costs.measure(model.engine, repeats=args.repeats, context_tokens=args.context_tokens,
                                        progress=lambda: bar.update(1))
    else:
        with tqdm(total=2 * max(1, args.repeats // 2) + len(STEP_SIZES) + len(SCORE_SIZES) + 2, unit="probe",
                  disable=not sys.stderr.isatty()) as bar:
            costs = calibrate(model.engine, repeats=args.repeats, context_tokens=args.context_tokens,
                              progress=lambda: bar.update(1))
    costs = replace(costs, meta={**costs.meta, "engine": args.engine, "model": args.model, "threads": args.threads})
    if args.engine == "vllm":  # kept for the model on this machine: ssr serve and stock vLLM's ssr drafter read it
        from ..pricing.probe import write_table

        kept = vllm_costs.table_path(model.engine.name)
        write_table(kept, costs)
        print(f"kept for {model.engine.name} on this machine: {kept}", file=sys.stderr)
    text = costs.to_json()
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n", encoding="utf-8")
        print(f"cost model: {args.out}", file=sys.stderr)
    print(text)
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    from ..pricing.costs import load_costs
    from .drafts import DraftBook
    from .simulate import anchor_to_ar, format_projection, project_modes, simulate, summarise_projection

    project = _modes(args.project_modes, "--project-modes") if args.project_modes else []
    costs = load_costs(args.cost_model)
    rows = [r for r in _rows_at([Path(p) for p in args.traces]) if r.get("config", {}).get("sampling", {}).get("temperature", 0) == 0]
    if not rows:
        raise ConfigError("no greedy rows to replay (traces replay only under greedy decoding)")
    if project:
        rows = project_modes(rows, project)
    drafts = None
    if args.drafts == "planned" or args.record_drafts:
        if args.context_size < 64:
            raise ConfigError(f"--context-size must be >= 64, got {args.context_size}")
        # the rows' model on llama.cpp, to write the planned drafts they lack (untimed)
        engine = load_engine(args.record_drafts, "llama.cpp", context_size=args.context_size) \
            if args.record_drafts else None
        drafts = DraftBook(engine)
    try:
        projected = simulate(rows, costs, GenerationConfig(), args.spans, drafts, progress=bool(args.record_drafts),
                             host=_host_setting(args.host))
    finally:  # drafts written before an error (Ctrl-C, a missing draft) are kept
        if args.save_traces:
            _write_rows(Path(args.save_traces), rows)
    if drafts is not None:
        print(f"planned drafts: {drafts.read} read from the rows, {drafts.written} written by the model",
              file=sys.stderr)
    if args.anchor_ar:
        projected = anchor_to_ar(projected)
    table = summarise_projection(projected)
    if args.json:
        print(json.dumps({"cost_model": costs.source, "table": table}, indent=1))
    else:
        print(f"cost model: {costs.source}; spans: {args.spans}; host time on the clock: {args.host}"
              + ("; anchored to each item's ar" if args.anchor_ar else ""))
        print(format_projection(table, markdown=args.markdown))
    return 0


def _write_rows(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for row in rows:
            if not row.get("projected"):  # made by --project-modes: not a run
                out.write(json.dumps(row) + "\n")


def cmd_traces(args: argparse.Namespace) -> int:
    """`ssr traces`: text traces replayed in every mode under cost models (bench/trace_replay.py)."""
    from tqdm import tqdm

    from ..engines.vocab import load_vocab
    from .trace_replay import replay_all
    from .trace_drafts import DraftChoice
    from ..proposing.lookup import NgramSettings
    from .traces import load_traces, tokenize_trace

    modes, orders, host, settings = _trace_options(args)
    ngram = NgramSettings.parse(args.ngram) if args.ngram else None
    DraftChoice.parse(args.drafts)  # a bad choice fails before the traces load
    traces = load_traces([Path(f) for f in args.files], args.limit, args.groups, args.tasks)
    vocab = load_vocab(args.tokenizer)
    tokens = [tokenize_trace(t, vocab) for t in tqdm(traces, unit="trace", desc="tokenizing", dynamic_ncols=True,
                                                      disable=not sys.stderr.isatty())]
    rows = replay_all(tokens, modes, settings, orders, host, progress=sys.stderr.isatty(), candidates=args.candidates,
                      ngram=ngram, recorded_k=args.recorded_k, drafts=DraftChoice.parse(args.drafts))
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "rows.jsonl", "w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")
    _print_trace_tables(rows, args)
    note = (f"`ssr traces` on {', '.join(args.files)}: {len(traces)} traces, tokenizer {vocab.name}, costs "
            f"{', '.join(s.name for s in settings)}, host time {args.host}, several candidates verified as "
            f"{ {'tree': 'one token tree', 'forks': 'forks', 'chain': 'one chain (one candidate a pass)'}[args.candidates]}"
            + (f"; ngram-v1 at {args.ngram} (min, max, k)" if ngram else "")
            + (f"; recorded modes at k = {args.recorded_k}" if any(m.startswith("recorded-") for m in modes) else "")
            + ".")
    path = write_report(rows, out_dir, note)
    print(f"\nrows: {out_dir / 'rows.jsonl'}; report: {path}", file=sys.stderr)
    return 0


def _trace_options(args: argparse.Namespace) -> tuple[list[str], list[str], object, list]:
    """`ssr traces`' modes, orders, host-time setting and cost settings, checked before any replay."""
    from ..pricing.costs import load_costs
    from .trace_replay import ORDERS, CostSetting, mode_config

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for mode in modes or [""]:
        mode_config(mode)
    orders = [o.strip() for o in args.orders.split(",") if o.strip()]
    if not orders or any(o not in ORDERS for o in orders):
        raise ConfigError(f"--orders: give cold and/or deployment, comma-separated; got {args.orders!r}")
    if args.limit is not None and args.limit < 1:
        raise ConfigError("--limit must be >= 1")
    if args.step_ms <= 0:
        raise ConfigError("--step-ms must be > 0")
    host = _host_setting(args.host)
    if args.batch < 1:
        raise ConfigError(f"--batch must be >= 1, got {args.batch}")
    at = f"@batch{args.batch}" if args.batch > 1 else ""  # every mode priced among that many requests
    settings = [CostSetting((spec if spec.startswith("gpu") else Path(spec).stem) + at,
                            load_costs(spec).at_batch(args.batch), args.batch)
                for spec in (s.strip() for s in args.cost_model.split(",")) if spec]
    if not settings:
        raise ConfigError("--cost-model: give 'gpu', 'specdecode-h100' or calibrate JSON files")
    if args.tasks is not None and args.tasks < 1:
        raise ConfigError("--tasks must be >= 1")
    if args.recorded_k < 1:
        raise ConfigError(f"--recorded-k must be >= 1, got {args.recorded_k}")
    return modes, orders, host, settings


def _print_trace_tables(rows: list[dict], args: argparse.Namespace) -> None:
    """`ssr traces`' tables: the headline, every mode's, tokens a pass, by turn (agent
    conversations) and by source."""
    from .report import format_sources, sources_table
    from .trace_replay import format_headline, format_pass_table, headline_table, pass_table

    print(format_headline(headline_table(rows, args.step_ms), args.step_ms, args.markdown))
    print()
    print(format_table(summarise(rows), args.markdown))
    print()
    print(format_pass_table(pass_table(rows, args.step_ms), args.step_ms, args.markdown))
    if any(row.get("turn") for row in rows):  # agent conversations: by turn and by part
        from .turns import format_turn_table, turn_table

        print()
        print(format_turn_table(turn_table(rows), args.markdown))
    sources = sources_table(rows, lambda row: row["suite"])
    if sources:
        print()
        print(format_sources(sources, args.markdown))


def _host_setting(text: str):
    """--host-time: None (off), "measured", or seconds per pass from milliseconds."""
    if text in ("off", "measured"):
        return None if text == "off" else text
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ConfigError(f"--host-time: give off, measured or milliseconds per pass (>= 0), got {text!r}")
    return value / 1e3
