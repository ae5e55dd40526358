"""The model process: one loaded model in a process of its own, and the only importer of llama.cpp.

Why a package of its own: llama.cpp maps a model's weights from its file and can end the process
that maps them (SIGBUS on a file changed under it, `GGML_ASSERT` aborts, the out-of-memory killer),
so the service runs each model in a process started as `python -m lmsp_tray.runner.worker` and
never loads `libllama` itself. Everything that touches llama.cpp lives here, and an import-linter
contract holds it: `llama_cpp` is imported from `runner` only, and nothing in the service imports
`runner` (`engine.process` starts the worker by its module name). Device discovery runs here too,
as a one-shot `python -m lmsp_tray.runner.probe` the service reads once at start-up.

`worker` reads the service's frames (`engine.wire`) and drives `model.LlamaModel`, which owns the
llama.cpp model and context (`runtime` holds the process-wide llama.cpp state). Its
`scheduler.Scheduler` decodes every running job together (continuous batching, `batch`), sampling
with `sampler`'s chains, drafting with `speculation`, streaming text through `textstream`, after
`grammars.GrammarBuilder` compiled a job's grammar; `kv_states` saves and restores sequences
through `prompt_cache` (and `swa`'s window checkpoints); `embedder.Embedder` serves embedding
models instead. The scheduler and the embedder see the model through `handles`, the few members
they use. The model process may import the service's plain data (`engine.jobs`, `engine.wire`,
`engine.load_plan`, ...), never the other way round.
"""
