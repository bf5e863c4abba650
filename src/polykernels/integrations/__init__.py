"""One call to put polykernels' ops into a model: `transformers` (Qwen3-Next, Qwen3.5) and `diffusers` (FLUX)."""
