"""Chunked gated delta rule forward (the linear attention of Qwen3-Next / Qwen3.5)."""

from polykernels.gated_delta_rule.chunk import chunk_gated_delta_rule
from polykernels.gated_delta_rule.guards import choose
from polykernels.gated_delta_rule.reference import chunk_gated_delta_rule_torch, naive_recurrent_gated_delta_rule

__all__ = ["choose", "chunk_gated_delta_rule", "chunk_gated_delta_rule_torch", "naive_recurrent_gated_delta_rule"]
