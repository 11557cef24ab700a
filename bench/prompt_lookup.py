"""Draft tokens by prompt lookup (pipeline/llm/prompt_lookup.py, checked in one forward pass a step by
pipeline/llm/batching.py) against decoding one token a step, on a pass like a stage's validation pass.

    python bench/prompt_lookup.py [--model smollm2-135m-instruct] [--queries 24] [--max-tokens 128] [--repeats 2]
        [--draft-tokens 4]

The requests are the bundled demo's terminal turns in the stages' shape (bench/local_decoding.py `demo_requests`),
all admitted at once, greedy, as validation and evaluation ask. Both variants run on the project's attention
for multi-token steps (pipeline/llm/packed_attention.py; one-token steps are transformers' own). After one pass
not counted, the variants alternate, each pass timed whole (prefill included: it is the same work in both);
prints each pass, the medians' ratio, the decoding steps saved, and whether the answers agree (they should to the
token but for float rounding: a step of several tokens a row sums in another order than one token a step).
"""

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.base_model import add_model_argument, model_folder
from bench.local_decoding import demo_requests
from bench.prefix_sharing import answer, print_alternating


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_argument(parser)
    parser.add_argument("--queries", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2, help="passes per variant, alternating")
    parser.add_argument("--draft-tokens", type=int, default=4)
    args = parser.parse_args()

    from pipeline.config.llm import EndpointConfig
    from pipeline.llm import batching
    from pipeline.llm.batching import MIN_SHARED_PREFIX
    from pipeline.llm.transformers_backend import TransformersBackend

    steps = {"one token": 0, "drafts": 0}
    counting = batching.Scheduler._step

    def counted(self, batch):
        steps[variant] += 1
        return counting(self, batch)

    batching.Scheduler._step = counted
    variants = {"one token": 0, "drafts": args.draft_tokens}
    passes: dict[str, list[float]] = {name: [] for name in variants}
    answers: dict[str, list[list[int]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = model_folder(args.model, Path(tmp))
        backend = TransformersBackend(EndpointConfig(backend="transformers", model=folder, device="cpu"))
        prompts = backend._prompt_ids(demo_requests(args.queries), "")
        variant = "one token"
        answer(backend, prompts, args.max_tokens, MIN_SHARED_PREFIX, 0)  # warm-up, not counted
        steps["one token"] = 0
        for _ in range(args.repeats):
            for variant, draft_tokens in variants.items():
                answers[variant], _, seconds = answer(
                    backend, prompts, args.max_tokens, MIN_SHARED_PREFIX, draft_tokens
                )
                passes[variant].append(seconds)
    batching.Scheduler._step = counting

    label = f"max_tokens {args.max_tokens}, model {args.model}"
    notes = {name: f"; {count // args.repeats} steps a pass" for name, count in steps.items()}
    print_alternating(prompts, label, passes, answers, f"with {args.draft_tokens} draft tokens", notes)


if __name__ == "__main__":
    main()
