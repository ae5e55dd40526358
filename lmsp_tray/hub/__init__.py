"""Getting models: GGUF downloads from Hugging Face into the shared Hugging Face cache.

A person without a model (or wanting another) names one the way Ollama and
llama.cpp do — ``hf.co/org/repo:Q4_K_M``, ``org/repo``, ``org/repo/file.gguf``
or a ``…/resolve/…`` URL (`refs`) — and gets it in the standard cache
(``models--org--repo/blobs`` + ``snapshots``, `cache`), where discovery and
every other tool already look. `remote` is the one place that talks to the Hub
(through ``huggingface_hub``: its endpoint, the user's token where it keeps it,
its typed errors); `variants` picks the quantization; `transfer` fetches one
file resumably, verified (size and SHA-256) before it is linked into a
snapshot, shared by concurrent pulls; `space` refuses a download the disk
cannot hold; `fit` says whether the model suits this machine, from the load
planner; `pull` puts these together for the CLI and the service.

Layer: above discovery and the engine's load planner, below serving (which
runs pulls as durable tasks). No HTTP server, no SQL, no llama.cpp here.
"""
