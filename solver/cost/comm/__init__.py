"""Communication: collectives on a tiered topology and what each parallelism sends.

    comm            collective time = latency + bytes x factor / bus bandwidth, per tier
    nccl_latency    the latency NCCL's own model gives a group of ranks and nodes
    comm_ep         expert-parallel all-to-alls and what of them stays exposed
    pipeline_sends  the hand-off of activations and gradients between pipeline stages
    ring_attention  context parallelism's ring: what each rank sends, what hides behind it
    kv_transfer     a prompt's KV cache sent from a prefill engine to a decode engine
"""
