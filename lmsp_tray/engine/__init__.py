"""The engine layer: the service's side of a model. It never loads llama.cpp, nor imports `runner`.

Why apart from `runner` (the model process): a llama.cpp crash, a SIGBUS on a model file changed
under it or the out-of-memory killer must end one model, never the service, so llama.cpp runs only
in model processes and everything here is what the service needs to drive them. Import-linter
contracts hold it: `llama_cpp` is imported from `runner` only, and `engine` never imports `runner`.

`manager.ModelManager` loads, keeps alive, evicts and unloads models within a memory budget, sized
by `load_plan` (GPU layers, context, parallel sequences) from what `devices` learnt of the machine
(a one-shot probe process, `runner.probe`). Each model runs in a process of its own, which
`process.ModelProcess` starts by module name (`launch`), with `allocator`'s malloc, and drives over
`wire` frames; `loaded.LoadedModel` is what it offers the service. Jobs go out as
`jobs.GenerationJob` (with `sampling.SamplingParams`, `trigger`'s lazy grammar markers) or
`embedding.EmbedJob` and results come back through their sink; `admission` answers 429 and 503
without a round trip, `templates` renders chat prompts here, and `cache_folders` says where a
model's saved prompt states lie. No HTTP, no SQL, no protocol here.
"""
