"""llama.cpp's greedy tokens on a GGUF, for ProcessPeer to build in a child process (so this
module imports from the tests folder on sys.path, which spawn passes on): a check that
llama.cpp loads and runs a file tacit wrote, not a benchmark."""

import llama_cpp


class LlamaCppGreedy:
    def __init__(self, path: str, n_ctx: int) -> None:
        # An f32 K/V cache: llama.cpp's default f16 one moves tiny models' logits by ~5e-3.
        self.llm = llama_cpp.Llama(
            model_path=path,
            n_ctx=n_ctx,
            n_threads=2,
            verbose=False,
            type_k=llama_cpp.GGML_TYPE_F32,
            type_v=llama_cpp.GGML_TYPE_F32,
        )

    def greedy(self, prompt: list[int], n: int) -> list[int]:
        self.llm.reset()
        out = []
        for token in self.llm.generate(prompt, top_k=1, temp=0.0, reset=True):
            out.append(int(token))
            if len(out) == n:
                break
        return out
