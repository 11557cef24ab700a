"""Judge-free metrics of one prediction against the real observation (issue 12), and the score mapping.

- `agentworldbench_sql` (in the store), `agentworldbench_score` (in Python): AgentWorldBench maps a 1-5 judge
  score onto 0-100 as (raw - 1) / 4 x 100 (SPEC.md, "Evaluation"), per criterion and for their mean.
- ROUGE-L: F1 of the longest common subsequence of words (rouge-score's tokenizer: lower-cased
  alphanumeric runs), symmetric in the two texts.
- Exact match on deterministic content: the rubrics (data/rubrics/) separate deterministic content,
  which must match exactly, from runtime metadata (timestamps, PIDs, durations, generated ids), which
  only needs the right form. So both texts have their runtime metadata replaced by one placeholder per
  kind, and trailing whitespace of every line and of the text dropped, before they are compared: a
  prediction that differs only in a timestamp or a PID matches; one that differs in a file's contents
  does not. Only what is runtime metadata is masked (issue 17, item 13): a bracketed number is a PID
  only after a process name (`sshd[977]:`) or a job number, a d:dd is a clock time only standing alone
  (not `app.py:10:15`), and a text of whitespace only is not silence. Pre-existing content (an unseen file, a package list) cannot be told apart from
  deterministic content without a judge, so it must match too: the metric is strict by design.
- JSON validity: where the reference is a JSON object or array, whether the prediction parses as one.
- Semantic match (RWML, SPEC.md): 1 - similarity below a threshold, the similarity being the semantic
  judge's (pipeline/rewards/semantic.py).
- Rank correlation: Spearman's rho, with ties at their mean rank; None where it is undefined (fewer
  than three pairs, or one side constant).
"""

import re
from collections.abc import Sequence

from pipeline.rewards.semantic import is_json

# Runtime metadata, most specific first (an ISO timestamp before its date and its time).
RUNTIME_METADATA = (
    ("<timestamp>", re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?")),
    (
        "<date>",
        re.compile(
            r"\b\d{4}-\d{2}-\d{2}\b|\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun),? (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +\d{1,2}\b|\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +\d{1,2}\b"
        ),
    ),
    # A clock time stands alone: `app.py:10:15` is a file's line and column, deterministic content.
    ("<time>", re.compile(r"(?<![\w.:/-])\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?![\w:])")),
    ("<uuid>", re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b")),
    ("<address>", re.compile(r"\b0x[0-9a-fA-F]+\b")),
    # Commit hashes, container ids, temporary names: hex runs of 7+ holding a digit and a letter.
    ("<hex>", re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,}\b")),
    ("<duration>", re.compile(r"\b\d+(?:\.\d+)?\s?(?:ms|us|µs|ns|s|sec|secs|seconds)\b")),
    # A PID where the text says it is one: `pid 4242`, `"pid": 4242`, a syslog tag `sshd[977]:`, the PID
    # after a job number (`[1] 4242`). A bare `[3]` is a list or an index: content.
    ("<pid>", re.compile(r"(?i)\bpid\b\"?[ =:]*\d+\b")),
    ("<pid>", re.compile(r"(?<=[A-Za-z_)])\[\d+\](?=:)")),
    ("<pid>", re.compile(r"(?m)^(\[\d+\][+-]?\s+)\d+$"), r"\1<pid>"),
)


def agentworldbench_sql(column: str) -> str:
    """SQL of a 1-5 judge score on AgentWorldBench's 0-100 scale (the aggregates are computed in the store)."""
    return f"(({column}) - 1) / 4 * 100"


def agentworldbench_score(raw: float) -> float:
    """A 1-5 judge score on AgentWorldBench's 0-100 scale, for scores aggregated outside the store."""
    return (raw - 1.0) / 4.0 * 100.0


def mask_runtime_metadata(text: str) -> str:
    """The text with its runtime metadata masked and its line ends stripped. A text of whitespace only is
    returned as it is: a blank line is output, and a command that printed nothing printed no blank line."""
    if not text.strip():
        return text
    for placeholder, pattern, *replacement in RUNTIME_METADATA:
        text = pattern.sub(replacement[0] if replacement else placeholder, text)
    return "\n".join(line.rstrip() for line in text.rstrip().splitlines())


def exact_match(prediction: str, reference: str) -> bool:
    return mask_runtime_metadata(prediction) == mask_runtime_metadata(reference)


def json_validity(prediction: str, reference: str) -> bool | None:
    """None where the reference is not JSON (the metric does not apply)."""
    return is_json(prediction) if is_json(reference) else None


def semantic_match(similarity: float, threshold: float) -> bool:
    return 1.0 - similarity < threshold


class RougeL:
    """ROUGE-L F1, the scorer built once."""

    def __init__(self):
        from rouge_score import rouge_scorer

        self.scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)

    def __call__(self, prediction: str, reference: str) -> float:
        return self.scorer.score(reference, prediction)["rougeL"].fmeasure


def _ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for position in range(start, end + 1):
            ranks[order[position]] = (start + end) / 2.0
        start = end + 1
    return ranks


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    if len(xs) != len(ys):
        raise ValueError("spearman: the two sequences differ in length")
    if len(xs) < 3:
        return None
    rx, ry = _ranks(xs), _ranks(ys)
    mean = (len(xs) - 1) / 2.0
    covariance = sum((a - mean) * (b - mean) for a, b in zip(rx, ry))
    spread_x = sum((a - mean) ** 2 for a in rx)
    spread_y = sum((b - mean) ** 2 for b in ry)
    if spread_x == 0 or spread_y == 0:
        return None
    return covariance / (spread_x * spread_y) ** 0.5
