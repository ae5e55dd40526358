"""Edit workload: a ~400-token text (and a code-edit variant) asked back with a small change.

Single stream, temperature 0. Decode tokens/s of lmsp-tray with speculative decoding (prompt
lookup, on by default) against the same service with it off, `llama-server -np 1` as users run it,
and llama-server with each of its n-gram `--spec-type` settings (`ngram-simple`, `ngram-mod`,
`ngram-cache`; `--no-repack` where the CPU has AMX, as the service keeps its weights unrepacked);
and how often each output is identical to the same peer's non-speculative output (the identity rate).

  .venv/bin/python benchmarks/edit_workload.py [--rounds 3] [--variants 3] [--quick] [--peers lmsp-tray,ngram-simple,ngram-mod]

Prints the CPU's model and vector extensions first: n-gram speculation pays differently on AVX2 and
AVX-512 machines. Peers run in turn, one at a time (the machine has few cores), each round visiting
every peer (interleaved, so a slow spell of the machine falls on all of them); the table gives each
peer's median and its spread (lowest-highest round), and the words each output copied from the
source (in runs of 4 or more words): a greedy text that parted from the source early copies less,
and drafts less, so rounds whose texts parted differently can be told apart. Each run's line also
counts the words that repeat a run of 4 or more words seen before (in the source or earlier in the
output: what an n-gram drafter can propose; Gemma goes on after the edited text, and a text that
copies itself again drafts as well as one that copies the source) and the machine's load average.
`--peers` runs only the peers named (`lmsp-tray`, `spec-off`, `default`, or an n-gram `--spec-type`;
the ratios to a peer not run are left out). llama-server's n-gram tables outlive a request
(`ngram-mod`), as lmsp-tray's recent sequences do, so rounds after the first draft from the first.

Why `--variants` (the same documents with their names changed: the street, the orders): which
greedy text a run produces is decided by near-ties in the first tokens, and those fall by the
rounding of one batch shape or another. The same service gave two different code edits for the same
prompt, one from a fresh prompt (112 words copied, 57 decodes, 4.3-5.0 s) and one when the prompt
was already in its cache and only its last token was decoded (114 words copied, llama-server's own
text, 36 decodes, 3.6-4.3 s). A ratio between two servers on one document measures whose text was
the easier one; over several documents it measures speed. Each run's line names its text (`text
1a2b3c4d`, a hash); the ratios are given over all runs, and over the runs where lmsp-tray decoded
the very text the best n-gram peer did.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import hashlib
import json
import os
import statistics
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    cpu_line,
    gemma_path,
    llama_server_binary,
    llama_server_cpu_args,
    lmsp_service,
    physical_cores,
    print_table,
    stream_lmsp_turn,
)
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

# The names each variant gives the documents (variant 0 is the documents as they are).
STREETS = ("Harbour", "Mill", "Castle", "Station", "Orchard", "Bridge")
THINGS = (("orders", "order"), ("invoices", "invoice"), ("baskets", "basket"), ("tickets", "ticket"))
THINGS += (("parcels", "parcel"), ("bookings", "booking"))


def sources(variant: int) -> dict[str, str]:
    """The two documents of one variant: the notice of another library, the function over other things."""
    street = STREETS[variant % len(STREETS)]
    plural, singular = THINGS[variant % len(THINGS)]
    code = CODE.replace("orders", plural).replace("order", singular)
    return {"text": TEXT.replace("Harbour", street), "code": code}


def messages(variant: int) -> dict[str, str]:
    docs = sources(variant)
    singular = THINGS[variant % len(THINGS)][1]
    return {
        "text": "Copy the following notice exactly, word for word, but change the opening time on Saturdays "
        "from ten to eleven. Reply with the notice only.\n\n" + docs["text"],
        "code": f"Rename the variable `amount` to `{singular}_total` everywhere in this Python function and "
        "change nothing else. Reply with the code only.\n\n" + docs["code"],
    }


def render(message: str) -> str:
    return f"<start_of_turn>user\n{message}<end_of_turn>\n<start_of_turn>model\n"


KINDS = ("text", "code")
NGRAM_TYPES = ("ngram-simple", "ngram-mod", "ngram-cache")
COPY_RUN_WORDS = 4  # a run of this many words in the source's order counts as copied


def copied_words(text: str, source: str) -> int:
    """How many of the output's words it copied from `source`, in runs of `COPY_RUN_WORDS` or more."""
    out, src = text.split(), source.split()
    blocks = difflib.SequenceMatcher(None, out, src, autojunk=False).get_matching_blocks()
    return sum(b.size for b in blocks if b.size >= COPY_RUN_WORDS)


def repeated_words(text: str, source: str) -> int:
    """How many of the output's words repeat a run of `COPY_RUN_WORDS` words seen before them (in
    `source`, or earlier in the output)."""
    out, n = text.split(), COPY_RUN_WORDS
    seen = {tuple(source.split()[i : i + n]) for i in range(len(source.split()) - n + 1)}
    marked = [False] * len(out)
    for i in range(len(out) - n + 1):
        run = tuple(out[i : i + n])
        if run in seen:
            marked[i : i + n] = [True] * n
        seen.add(run)
    return sum(marked)


def text_id(text: str) -> str:
    """A short name for an output's exact text: runs that share it decoded the same tokens."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]


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
def peers(model: Path, threads: int, binary: Path, quick: bool, only: list[str]) -> Iterator[dict[str, Callable]]:
    def wanted(key: str) -> bool:
        return not only or key in only

    with contextlib.ExitStack() as stack:
        found: dict[str, Callable] = {}
        for name, config in (("lmsp-tray", ""), ("lmsp-tray, speculative off", "speculative = false\n")):
            if not wanted("lmsp-tray" if not config else "spec-off"):
                continue
            url, _ = stack.enter_context(
                lmsp_service(model, threads=threads, config=config + "parallel = 1\nkeep_alive = '1h'\n")
            )
            found[name] = lambda c, message, n, url=url: lmsp_run(c, url, message, n)
        cpu = tuple(llama_server_cpu_args())
        specs: dict[str, tuple[str, ...]] = {"llama-server -np 1": cpu} if wanted("default") else {}
        for kind in NGRAM_TYPES[:2] if quick else NGRAM_TYPES:
            if wanted(kind):
                specs[f"llama-server --spec-type {kind}"] = ("--spec-type", kind, *cpu)
        for name, extra in specs.items():
            url = stack.enter_context(llama_server(binary, model, parallel=1, threads=threads, extra=extra))
            found[name] = lambda c, message, n, url=url: server_run(c, url, render(message), n)
        yield found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=600)
    parser.add_argument("--variants", type=int, default=3, help="documents of each kind (their names changed)")
    parser.add_argument("--quick", action="store_true", help="1 round, 2 llama-server n-gram settings")
    parser.add_argument("--peers", default="", help="only these: lmsp-tray,spec-off,default,ngram-simple,...")
    args = parser.parse_args()
    rounds = 1 if args.quick else args.rounds
    threads = physical_cores()
    print(f"CPU: {cpu_line()}; {threads} threads", flush=True)
    binary = llama_server_binary()
    model = gemma_path()
    rates: dict[tuple[str, str], list[float]] = {}
    texts: dict[tuple[str, str], list[str]] = {}
    copies: dict[tuple[str, str], list[int]] = {}
    only = [word for word in args.peers.split(",") if word]
    with peers(model, threads, binary, args.quick, only) as found, httpx.Client(timeout=600) as c:
        for name, run in found.items():  # warm-up: load, first prompt
            run(c, messages(0)["text"], 8)
        for _ in range(rounds):
            for variant in range(args.variants):
                asked, docs = messages(variant), sources(variant)
                for key in KINDS:
                    for name, run in found.items():
                        rate, text, n = run(c, asked[key], args.tokens)
                        copied = copied_words(text, docs[key])
                        again = repeated_words(text, docs[key])
                        load = os.getloadavg()[0]
                        print(
                            f"{key:4s} {variant} {name:36s} {rate:7.1f} tok/s  {n} tokens, {copied} words copied, "
                            f"{again} repeated, text {text_id(text)}; load {load:.1f}",
                            flush=True,
                        )
                        rates.setdefault((name, key), []).append(rate)
                        texts.setdefault((name, key), []).append(text)
                        copies.setdefault((name, key), []).append(copied)
    names = list(found)

    def median(name: str, key: str) -> float:
        return statistics.median(rates[(name, key)])

    rows = []
    for name in names:
        row = [name]
        for key in KINDS:
            low, high = min(rates[(name, key)]), max(rates[(name, key)])
            cell = f"{median(name, key):.1f} tok/s [{low:.1f}-{high:.1f}] ("
            if ("llama-server -np 1", key) in rates:
                cell += f"{median(name, key) / median('llama-server -np 1', key):.2f}x default; "
            plain = "lmsp-tray, speculative off" if name.startswith("lmsp") else "llama-server -np 1"
            if (plain, key) in texts:
                same = sum(a == b for a, b in zip(texts[(name, key)], texts[(plain, key)], strict=True))
                cell += f"identical {same}/{len(texts[(name, key)])}; "
            row.append(cell + f"{statistics.median(copies[(name, key)]):.0f} words copied)")
        rows.append(tuple(row))
    print(
        f"Gemma 3 270M, {threads} threads, {rounds} rounds of {args.variants} documents each, {args.tokens} max "
        "tokens, medians [spread]"
    )
    print_table(rows, ("peer", *KINDS))
    if "lmsp-tray" not in names:
        return
    for key in KINDS:
        ours = median("lmsp-tray", key)
        ratios = [f"{key}: lmsp-tray"]
        if "llama-server -np 1" in names:
            ratios.append(f"/ llama-server default {ours / median('llama-server -np 1', key):.2f} (>= 1.5)")
        spec = [n for n in names if n.startswith("llama-server --spec")]
        if spec:
            best = max(spec, key=lambda n, key=key: median(n, key))
            pairs = list(
                zip(
                    rates[("lmsp-tray", key)],
                    rates[(best, key)],
                    texts[("lmsp-tray", key)],
                    texts[(best, key)],
                    strict=True,
                )
            )
            ratios.append(
                f"/ best n-gram ({best}) {ours / median(best, key):.2f} (>= 1.0; per run "
                + ", ".join(f"{a / b:.2f}" for a, b, _, _ in pairs)
                + ")"
            )
            alike = [a / b for a, b, ours_text, their_text in pairs if ours_text == their_text]
            if alike:  # runs that decoded the very text the best n-gram peer did: speed, not luck
                ratios.append(f"/ same text {statistics.median(alike):.2f} ({len(alike)} of {len(pairs)} runs)")
            else:
                ratios.append(f"(no run decoded the same text as {best})")
        if "lmsp-tray, speculative off" in names:
            ratios.append(f"/ speculative off {ours / median('lmsp-tray, speculative off', key):.2f}")
        print(" ".join(ratios))


if __name__ == "__main__":
    main()
