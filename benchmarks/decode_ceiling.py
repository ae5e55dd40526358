"""The ceiling of a batched decode on this machine: llama.cpp called directly, no server around it.

    .venv/bin/python benchmarks/decode_ceiling.py [--streams 8] [--tokens 96] [--rounds 3]

Why: a server's aggregate over `n` concurrent greedy streams is bounded by what llama.cpp's kernels
take for one prefill of the `n` prompts and then one `n`-token decode per step. No scheduler, HTTP
layer or relay can beat that without drafting (tokens it did not decode one step at a time); so
`ceiling / llama-server` is the most any server can be ahead of llama-server on the same file with
drafts off, and `lmsp-tray / ceiling` is the share of the kernels' speed the service delivers.
`eight_streams.py` runs this as one more peer, in the same rotation as the servers.

`Ceiling` decodes the `n` prompts as the model process does (a sequence per stream, one KV stream
each, `kv_unified` off, the sliding-window layers at their window, the same thread count, weights
unrepacked where the CPU has AMX), greedy by an argmax over each sequence's logits, each sequence
ending at its end-of-generation token or at `tokens`. Prints each round's aggregate in tokens/s.
"""

from __future__ import annotations

import argparse
import ctypes
import time
from pathlib import Path

import llama_cpp
import numpy as np
from common import cpu_line, gemma_path, physical_cores, weights_unrepacked


class Ceiling:
    """One llama.cpp context of `streams` sequences on `model`, decoding greedy batches directly."""

    def __init__(self, model: Path, *, streams: int, threads: int, ctx_per_stream: int = 8192) -> None:
        llama_cpp.llama_backend_init()
        self._quiet = llama_cpp.llama_log_callback(lambda level, text, data: None)  # kept alive with self
        llama_cpp.llama_log_set(self._quiet, ctypes.c_void_p(0))
        mparams = llama_cpp.llama_model_default_params()
        if weights_unrepacked():  # as the service and `llama_server_cpu_args` do
            mparams.use_extra_bufts = False
        self.model = llama_cpp.llama_model_load_from_file(str(model).encode(), mparams)
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = ctx_per_stream * streams
        cparams.n_seq_max = streams
        cparams.n_batch = cparams.n_ubatch = 512
        cparams.n_threads = cparams.n_threads_batch = threads
        cparams.kv_unified = False
        cparams.swa_full = False
        cparams.no_perf = True
        self.ctx = llama_cpp.llama_init_from_model(self.model, cparams)
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.streams = streams
        self.batch = llama_cpp.llama_batch_init(512, 0, 1)
        self.outputs: dict[int, list[int]] = {}

    def tokenize(self, text: str) -> list[int]:
        raw = text.encode()
        buf = (llama_cpp.llama_token * (len(raw) + 8))()
        n = llama_cpp.llama_tokenize(self.vocab, raw, len(raw), buf, len(buf), True, True)
        return list(buf[:n])

    def decode(self, items: list[tuple[int, int, int, bool]]) -> None:
        """One `llama_decode` of (token, position, sequence, wants logits) items."""
        b = self.batch
        for i, (token, pos, seq, logits) in enumerate(items):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, 1, logits
            b.seq_id[i][0] = seq
        b.n_tokens = len(items)
        if llama_cpp.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")

    def argmax(self, i: int) -> int:
        logits = llama_cpp.llama_get_logits_ith(self.ctx, i)
        return int(np.ctypeslib.as_array(ctypes.cast(logits, ctypes.POINTER(ctypes.c_float)), (self.n_vocab,)).argmax())

    def _ends(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))

    def run(self, prompts: list[str], tokens: int) -> float:
        """Greedy continuations of `prompts`, all at once: output tokens per second of wall time."""
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.ctx), True)
        start = time.perf_counter()
        encoded = [self.tokenize(p) for p in prompts]
        items = [(t, pos, s, pos == len(e) - 1) for s, e in enumerate(encoded) for pos, t in enumerate(e)]
        nexts: dict[int, int] = {}
        for at in range(0, len(items), 512):
            chunk = items[at : at + 512]
            self.decode(chunk)
            nexts.update((seq, self.argmax(i)) for i, (_, _, seq, logits) in enumerate(chunk) if logits)
        positions = {s: len(e) for s, e in enumerate(encoded)}
        self.outputs = {s: [t] for s, t in nexts.items()}  # each sequence's tokens, for a check of the text
        produced = dict.fromkeys(nexts, 1)
        out = sum(not self._ends(t) for t in nexts.values())  # text tokens, as the servers' streams count them
        while True:
            live = [s for s in nexts if produced[s] < tokens and not self._ends(nexts[s])]
            if not live:
                break
            self.decode([(nexts[s], positions[s], s, True) for s in live])
            for i, s in enumerate(live):
                positions[s] += 1
                nexts[s] = self.argmax(i)
                self.outputs[s].append(nexts[s])
                produced[s] += 1
                out += not self._ends(nexts[s])
        return out / (time.perf_counter() - start)

    def text(self, seq: int) -> str:
        """The text of a sequence's output in the last `run`."""
        buf = ctypes.create_string_buffer(256)
        pieces = []
        for token in self.outputs[seq]:
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, 256, 0, False)
            pieces.append(buf.raw[:n])
        return b"".join(pieces).decode(errors="replace")

    def close(self) -> None:
        llama_cpp.llama_batch_free(self.batch)
        llama_cpp.llama_free(self.ctx)
        llama_cpp.llama_model_free(self.model)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from eight_streams import story
    from throughput import render

    threads = physical_cores()
    print(f"CPU: {cpu_line()}; {threads} threads; {args.streams} streams of {args.tokens} tokens")
    ceiling = Ceiling(gemma_path(), streams=args.streams, threads=threads)
    try:
        ceiling.run([render(story(0, i)) for i in range(args.streams)], 8)  # warm-up
        for r in range(args.rounds):
            rate = ceiling.run([render(story(r + 1, i)) for i in range(args.streams)], args.tokens)
            print(f"round {r + 1}: {rate:.1f} tok/s", flush=True)
    finally:
        ceiling.close()


if __name__ == "__main__":
    main()
