"""Edit workload: a ~400-token text (and a code-edit variant) asked back with a small change.

Single stream, temperature 0. Decode tokens/s of lmsp-tray with speculative decoding (prompt
lookup, on by default) against the same service with it off, `llama-server -np 1` as users run it,
and llama-server with each of its n-gram `--spec-type` settings; and how often each output is
identical to the same peer's non-speculative output (the identity rate).

  .venv/bin/python benchmarks/edit_workload.py --quick

Peers run in turn, one at a time (the machine has few cores), each round visiting every peer.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import gemma_path, llama_server_binary, lmsp_service, physical_cores, print_table, stream_lmsp_turn
from throughput import llama_server

TEXT = (
    "The library on Harbour Street opens at nine on weekdays and at ten on Saturdays. It is closed on "
    "Sundays and public holidays. Members may borrow up to eight books at a time for three weeks, and "
    "a loan can be renewed twice online or at the front desk, unless another member has reserved the "
    "book. Late returns cost twenty cents a day per item, up to a limit of five euros. Children under "
    "twelve pay no fines. The reading room on the first floor is quiet space: please switch phones to "
    "silent and take calls on the stairs. Laptops are welcome, and there are power sockets under every "
    "second table. The wireless network is called Harbour-Guest and needs no password; it is filtered "
    "for the safety of younger readers. Printing costs ten cents a page in black and white and forty "
    "cents in colour; pay at the desk before you collect your pages. The local history collection is "
    "in the basement and can be used by appointment on Tuesday and Thursday afternoons. Staff can help "
    "you trace a family name through the parish records, the old newspapers and the harbour registers, "
    "which go back to 1841. Groups of more than six people should book the meeting room in advance. "
    "Food is not allowed anywhere in the building, but covered drinks are fine in the reading room. "
    "Lost property is kept at the front desk for one month. If you have a question, ask any member of "
    "staff, call the desk during opening hours, or write to us and we will answer within two working "
    "days. We look forward to seeing you."
)

CODE = '''def summarize_orders(orders, tax_rate=0.2, currency="EUR"):
    """Return a summary of a list of orders: count, total, tax and the biggest order."""
    if not orders:
        return {"count": 0, "total": 0.0, "tax": 0.0, "largest": None, "currency": currency}
    total = 0.0
    largest = None
    for order in orders:
        amount = 0.0
        for line in order["lines"]:
            price = float(line["price"])
            quantity = int(line.get("quantity", 1))
            if quantity < 0:
                raise ValueError(f"negative quantity in order {order['id']}")
            amount += price * quantity
        if order.get("discount"):
            amount -= amount * float(order["discount"])
        total += amount
        if largest is None or amount > largest[1]:
            largest = (order["id"], amount)
    tax = round(total * tax_rate, 2)
    return {
        "count": len(orders),
        "total": round(total, 2),
        "tax": tax,
        "largest": largest[0],
        "currency": currency,
    }
'''

MESSAGES = {
    "text": "Copy the following notice exactly, word for word, but change the opening time on Saturdays "
    "from ten to eleven. Reply with the notice only.\n\n" + TEXT,
    "code": "Rename the variable `amount` to `order_total` everywhere in this Python function and change "
    "nothing else. Reply with the code only.\n\n" + CODE,
}


def render(message: str) -> str:
    return f"<start_of_turn>user\n{message}<end_of_turn>\n<start_of_turn>model\n"


PROMPTS = {name: render(message) for name, message in MESSAGES.items()}
NGRAM_TYPES = ("ngram-simple", "ngram-mod", "ngram-cache")


def lmsp_run(c: httpx.Client, url, message: str, tokens: int) -> tuple[float, str, int]:
    """Decode tokens/s after the first token, the text, and output tokens."""
    turn = stream_lmsp_turn(c, url, message, tokens)
    return turn.sample.decode_tps, turn.text, turn.sample.tokens


def server_run(c: httpx.Client, url: str, prompt: str, tokens: int) -> tuple[float, str, int]:
    """llama-server's /completion, streamed; its own timings give the decode rate (drafts arrive as
    several tokens in one chunk, so chunk times would misstate it)."""
    body = {"prompt": prompt, "n_predict": tokens, "temperature": 0, "stream": True, "cache_prompt": False}
    text: list[str] = []
    rate, n = 0.0, 0
    with c.stream("POST", f"{url}/completion", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            chunk = json.loads(line[6:])
            text.append(chunk.get("content", ""))
            if chunk.get("stop") and "timings" in chunk:
                rate = chunk["timings"]["predicted_per_second"]
                n = chunk["timings"]["predicted_n"]
    return rate, "".join(text), n


@contextlib.contextmanager
def peers(model: Path, threads: int, binary: Path, quick: bool) -> Iterator[dict[str, Callable]]:
    with contextlib.ExitStack() as stack:
        found: dict[str, Callable] = {}
        for name, config in (("lmsp-tray", ""), ("lmsp-tray, speculative off", "speculative = false\n")):
            url, _ = stack.enter_context(
                lmsp_service(model, threads=threads, config=config + "parallel = 1\nkeep_alive = '1h'\n")
            )
            found[name] = lambda c, key, n, url=url: lmsp_run(c, url, MESSAGES[key], n)
        specs: dict[str, tuple[str, ...]] = {"llama-server -np 1": ()}
        for kind in NGRAM_TYPES[:2] if quick else NGRAM_TYPES:
            specs[f"llama-server --spec-type {kind}"] = ("--spec-type", kind)
        for name, extra in specs.items():
            url = stack.enter_context(llama_server(binary, model, parallel=1, threads=threads, extra=extra))
            found[name] = lambda c, key, n, url=url: server_run(c, url, PROMPTS[key], n)
        yield found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=600)
    parser.add_argument("--quick", action="store_true", help="1 round, 2 llama-server n-gram settings")
    args = parser.parse_args()
    rounds = 1 if args.quick else args.rounds
    threads = physical_cores()
    binary = llama_server_binary()
    model = gemma_path()
    rates: dict[tuple[str, str], list[float]] = {}
    texts: dict[tuple[str, str], list[str]] = {}
    with peers(model, threads, binary, args.quick) as found, httpx.Client(timeout=600) as c:
        for name, run in found.items():  # warm-up: load, first prompt
            run(c, "text", 8)
        for _ in range(rounds):
            for key in PROMPTS:
                for name, run in found.items():
                    rate, text, n = run(c, key, args.tokens)
                    print(f"{key:5s} {name:36s} {rate:7.1f} tok/s  {n} tokens", flush=True)
                    rates.setdefault((name, key), []).append(rate)
                    texts.setdefault((name, key), []).append(text)
    names = list(found)
    rows = []
    for name in names:
        row = [name]
        for key in PROMPTS:
            rate = statistics.median(rates[(name, key)])
            base = statistics.median(rates[("llama-server -np 1", key)])
            plain = "lmsp-tray, speculative off" if name.startswith("lmsp") else "llama-server -np 1"
            same = sum(a == b for a, b in zip(texts[(name, key)], texts[(plain, key)], strict=True))
            row.append(f"{rate:.1f} tok/s ({rate / base:.2f}x default; identical {same}/{rounds})")
        rows.append(tuple(row))
    print(f"Gemma 3 270M, {threads} threads, {rounds} rounds, {args.tokens} max tokens, medians")
    print_table(rows, ("peer", *PROMPTS))
    best = {
        key: max(
            (n for n in names if n.startswith("llama-server --spec")),
            key=lambda n, key=key: statistics.median(rates[(n, key)]),
        )
        for key in PROMPTS
    }
    for key in PROMPTS:
        ours = statistics.median(rates[("lmsp-tray", key)])
        print(
            f"{key}: lmsp-tray / llama-server default {ours / statistics.median(rates[('llama-server -np 1', key)]):.2f} "
            f"(>= 1.5), / best n-gram ({best[key]}) {ours / statistics.median(rates[(best[key], key)]):.2f} (>= 1.0), "
            f"/ speculative off {ours / statistics.median(rates[('lmsp-tray, speculative off', key)]):.2f}"
        )


if __name__ == "__main__":
    main()
