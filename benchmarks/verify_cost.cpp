// What one llama_decode of n tokens, all with logits, costs after a 400-token prefix: the price of
// verifying an (n - 1)-token draft. Built twice, against llama-server's static build and against the
// service's libllama (llama-cpp-python's), it shows whether the two verify at the same speed (they
// do, within run-to-run noise: benchmarks/README.md, 3 December 2026), so that any difference between
// the servers' speculative decoding is in how they draft, not in the kernels.
//
//   S=$LMSP_BENCH_CACHE/llama-cpp-python-<version>; B=$S/build-server; V=$S/vendor/llama.cpp
//   g++ -O2 -std=c++17 benchmarks/verify_cost.cpp -I$V/include -I$V/ggml/include -o verify_static \
//     $B/src/libllama.a $B/ggml/src/libggml.a $B/ggml/src/libggml-cpu.a $B/ggml/src/libggml-base.a -fopenmp -ldl
//   L=$(echo $PWD/.venv/lib/python3*/site-packages/llama_cpp/lib)
//   g++ -O2 -std=c++17 benchmarks/verify_cost.cpp -I$V/include -I$V/ggml/include -o verify_shared \
//     -L$L -lllama -lggml -lggml-base -Wl,-rpath,$L
//   ./verify_static model.gguf 2>/dev/null; ./verify_shared model.gguf 2>/dev/null
//
// (build_llama_server.sh leaves $B behind.) Weights stay unrepacked, as both servers keep them on a
// CPU with AMX; on other CPUs drop `use_extra_bufts = false` to time the repacked kernels.
#include "llama.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

int main(int argc, char ** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s model.gguf\n", argv[0]);
        return 2;
    }
    llama_backend_init();
    auto mp = llama_model_default_params();
    mp.use_extra_bufts = false;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    auto cp = llama_context_default_params();
    cp.n_ctx = 4096;
    cp.n_batch = cp.n_ubatch = 512;
    cp.n_threads = cp.n_threads_batch = 2;
    cp.n_seq_max = 1;
    cp.no_perf = true;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!model || !ctx) {
        std::fprintf(stderr, "could not load %s\n", argv[1]);
        return 1;
    }
    auto mem = llama_get_memory(ctx);
    const int prefix = 400;
    llama_batch b = llama_batch_init(512, 0, 1);
    auto fill = [&](int n, int start, int salt, bool all_logits) {
        b.n_tokens = n;
        for (int i = 0; i < n; i++) {
            b.token[i] = 100 + (i * 37 + salt) % 5000;
            b.pos[i] = start + i;
            b.n_seq_id[i] = 1;
            b.seq_id[i][0] = 0;
            b.logits[i] = all_logits || i == n - 1;
        }
    };
    fill(prefix, 0, 0, false);
    llama_decode(ctx, b);
    for (int n : {1, 2, 4, 8, 16, 32, 48, 49, 63}) {
        std::vector<double> ms;
        for (int r = 0; r < 15; r++) {
            llama_memory_seq_rm(mem, 0, prefix, -1);
            fill(n, prefix, r, true);
            auto t0 = std::chrono::steady_clock::now();
            llama_decode(ctx, b);
            llama_get_logits_ith(ctx, n - 1);
            ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        }
        std::sort(ms.begin(), ms.end());
        std::printf("n=%2d  median %.2f ms  min %.2f\n", n, ms[ms.size() / 2], ms[0]);
    }
    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
