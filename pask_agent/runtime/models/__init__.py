"""Models: offline loading (GGUF -> cached safetensors), tokenizers, the transformers Cache and
attention seam that hands K/V to the store, fast CPU linear layers and the key offsets.
Imports runtime/memory/, kernels/ and errors; never turns/ or the engine."""
