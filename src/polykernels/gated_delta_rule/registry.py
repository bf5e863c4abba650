"""Registers the gated-delta-rule kernels with polykernels.kernel_registry."""
