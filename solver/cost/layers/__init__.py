"""One decoder layer (and the LM head) for one micro-batch on one GPU: FLOPs, compute, time.

    blocks                block kinds beyond attention + MLP (Mamba-2, DeltaNet, windows ...)
    flops                 FLOPs per token per layer kind (MFU's convention)
    layer_compute         a layer's compute by part, forward and backward
    layer_compute_kept    the same under the framework's element-wise fusion, kept per solve
    layer_time            a layer's time by part: compute, TP/CP/EP communication, host waits
    host_time             the host's time to issue a layer's ops, and the GPU's wait for it
    time_constants        TimeConstants: the step-time model's constants and switches
    framework_launches    host op counts per framework layer (TimeConstants.launches)
    fp8_scaling           per-tensor FP8 current scaling beyond delayed scaling
    quantization_padding  the grouped experts' padding copies for FP8 / FP4 GEMMs
    moe_eager             the routed experts' eager element-wise work
    rope_eager            a YaRN model's RoPE as eager PyTorch ops
"""
