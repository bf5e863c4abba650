"""INT4 QAT fake quantization (compiled CPU and CUDA/HIP kernels, one C++ source)."""

from polykernels.quant.fake_int4 import fake_int4_quant, int4_quant_codes
from polykernels.quant.guards import GROUP_SIZES, choose
from polykernels.quant.reference import fake_int4_quant_reference

__all__ = ["GROUP_SIZES", "choose", "fake_int4_quant", "fake_int4_quant_reference", "int4_quant_codes"]
