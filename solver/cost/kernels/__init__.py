"""How fast one GPU runs one piece of work: measured kernel tables and what the datasheet leaves.

    kernels            the packaged kernel tables (GEMM, quantize), interpolated
    kernels_attention  attention in the tables, FlashAttention-3 and Triton rates beside them
    kernels_moe        the fused-MoE lookups in the tables
    efficiency         a layer's GEMMs, attention core and element-wise passes in seconds
    precision          training precision recipes (`--precision`): which GEMMs run low
"""
