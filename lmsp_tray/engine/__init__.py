"""The engine layer: llama.cpp, and nothing above it touches llama.cpp.

`runtime` loads the library once per process, `load_plan` sizes a model for this machine (GPU
layers, context, parallel sequences), `model.LlamaModel` owns one model and its context,
`scheduler.Scheduler` decodes every running job of a model together (continuous batching) after
`grammars.GrammarBuilder` has compiled its grammar, and `manager.ModelManager` loads, keeps alive,
evicts and unloads models. In the service each model runs in a process of its own (`worker`),
driven through `process.ModelProcess` over `wire` frames, so a llama.cpp crash ends one model;
`loaded.LoadedModel` is what both sides offer. Jobs come in as `jobs.GenerationJob` and results
go out through their sink; no HTTP, no SQL, no protocol here.
"""
