"""One call to put polykernels' ops into a model: `transformers` (Qwen3-Next) and `diffusers` (FLUX)."""
