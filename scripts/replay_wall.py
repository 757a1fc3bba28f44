"""Wall milliseconds of the decoding loop per output token and per pass, replaying real traces on
the replay engine (GPU preset, cold, engine included): the before/after benchmark of the loop's
cost, for whichever ssr is first on PYTHONPATH (an older checkout's src too).

    python scripts/replay_wall.py --dump tokens.json ../shared/traces/humanevalplus-qwen3-8b.dev.jsonl.gz --limit 3
    PYTHONPATH=old/src python scripts/replay_wall.py tokens.json --modes ar,suffix,pld,ssr
    PYTHONPATH=src python scripts/replay_wall.py tokens.json --modes ar,suffix,pld,ssr

The dump (needs this checkout: ssr.bench.traces) holds token ids only, so older versions of the
loop replay exactly the same tokens. A one-token forced answer prefix makes a natural CoT end
replay the same way in every version.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def dump(out: str, files: list[str], limit: int) -> None:
    from ssr.bench.traces import tokenized_traces

    rows = [{"group": tokens.trace.group, "prompt_ids": tokens.prompt_ids, "cot_ids": tokens.cot_ids,
             "answer_ids": tokens.answer_ids} for tokens in tokenized_traces(files, limit=limit)]
    Path(out).write_text(json.dumps(rows))
    print(f"{len(rows)} traces, {sum(len(r['cot_ids']) + len(r['answer_ids']) for r in rows)} output tokens -> {out}")


def measure(path: str, modes: list[str]) -> None:
    import ssr
    from ssr.bench.replay import REPLAY_FORMAT, ReplayEngine, RowModel
    from ssr.config import GenerationConfig
    from ssr.pricing.costs import CostModel, gpu_preset
    from ssr.loop import Generation
    from ssr.pricing.drafting import Plan

    traces = json.loads(Path(path).read_text())
    prefix = 1 << 21  # a token no trace holds: the forced answer prefix
    print("ssr from", ssr.__file__)
    for mode in modes:
        wall = tokens = passes = same = 0
        for t in traces:
            model = RowModel(prompt_ids=t["prompt_ids"], cot_ids=t["cot_ids"], answer_ids=t["answer_ids"],
                             forced_end_ids=t["cot_ids"][-1:], answer_prefix_ids=[prefix], draft_ids=[],
                             draft_forked_at=None)
            engine = ReplayEngine(model, gpu_preset())
            config = GenerationConfig(mode=mode, thinking_budget=1 << 16, max_answer_tokens=1 << 15)
            plan = Plan(draft=False, stages=(), draft_tokens=1, verify_chunk=16)
            start = time.perf_counter()
            result = Generation(engine, REPLAY_FORMAT, config, t["prompt_ids"], costs=CostModel(table=gpu_preset()),
                                plan=plan).run()
            wall += time.perf_counter() - start
            m = result.metrics
            tokens += m.cot_tokens + m.answer_tokens
            passes += m.decode_steps + m.verify_passes + m.cot_passes + 1
            same += result.cot_ids == engine.cot and result.answer_ids == engine.answer
        print(f"{mode:7s} traces {len(traces)} identical {same}  wall ms/output token {1e3 * wall / tokens:.3f}  "
              f"wall ms/pass {1e3 * wall / passes:.3f}  tokens/pass {tokens / passes:.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="+", help="a token dump to replay (or, with --dump, trace files)")
    parser.add_argument("--dump", default=None, metavar="JSON", help="write the token dump of these trace files")
    parser.add_argument("--limit", type=int, default=3, help="with --dump: traces per (set, model)")
    parser.add_argument("--modes", default="ar,suffix,pld,ssr")
    args = parser.parse_args()
    if args.dump:
        dump(args.dump, args.paths, args.limit)
    else:
        measure(args.paths[0], args.modes.split(","))


if __name__ == "__main__":
    main()
