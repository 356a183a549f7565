"""Serving under vLLM: an engine's step, its rounds under load, queueing and its memory.

    step           compute seconds of one engine step on one GPU of a pipeline stage
    overhead       the engine's host overhead per step
    round          one scheduler round: decode rows and prefill tokens batched together
    curves         the rounds tabulated over decode populations, per candidate engine
    queueing       M/G/1 and GI/G/1 mean waits, wait percentiles, TPOT variance
    ttft_quantile  the TTFT percentile as the quantile of a sum
    load           TTFT and TPOT under an open-loop arrival rate
    closed         the closed loop of a client at fixed concurrency
    block_cache    what one sequence keeps between steps, per layer of a block pattern
    memory         per-GPU serving memory
"""
