"""The engine layer: llama.cpp, and nothing above it touches llama.cpp.

`runtime` loads the library once per process, `load_plan` sizes a model for this machine (GPU
layers, context, parallel sequences), `model.LlamaModel` owns one model and its context,
`scheduler.Scheduler` decodes every running job of a model together (continuous batching), and
`manager.ModelManager` loads, keeps alive, evicts and unloads models. Jobs come in as
`jobs.GenerationJob` and results go out through their sink; no HTTP, no SQL, no protocol here.
"""
